"""The FP8 lightning indexer (dsv32.dsa.fp8): the Hadamard rotation, the e4m3 quantization with the
reference's scale rules, scores equal to an FP8 GEMM's, and the selection it makes on every path."""

from __future__ import annotations

import math

import pytest
import torch

from dsv32.dsa import (
    fp8_indexer_keys,
    fp8_indexer_queries,
    hadamard,
    index_scores,
    indexer_topk,
    quantize_e4m3,
    select_topk,
)
from dsv32.dsa.fp8 import AMAX_FLOOR, FP8_MAX


def _sylvester(d: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h


@pytest.mark.parametrize("d", [1, 2, 8, 64, 128])
def test_hadamard_is_the_normalized_sylvester_matrix(d):
    x = torch.randn(3, 5, d, dtype=torch.float64)
    want = (x @ _sylvester(d)) / math.sqrt(d)
    torch.testing.assert_close(hadamard(x.float()), want.float(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(hadamard(hadamard(x.float())), x.float(), rtol=1e-5, atol=1e-5)


def test_hadamard_keeps_the_dtype_and_rejects_other_widths():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    y = hadamard(x)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y, hadamard(x.float()).to(torch.bfloat16), rtol=0, atol=0)
    with pytest.raises(ValueError, match="power-of-two"):
        hadamard(torch.randn(2, 96))


def test_rotation_leaves_exact_scores_unchanged():
    g = torch.Generator().manual_seed(0)
    q, w, k = (
        torch.randn(2, 9, 4, 64, generator=g),
        torch.rand(2, 9, 4, generator=g),
        torch.randn(2, 30, 64, generator=g),
    )
    torch.testing.assert_close(
        index_scores(hadamard(q), w, hadamard(k)), index_scores(q, w, k), rtol=1e-5, atol=1e-5
    )


def test_ue8m0_scales_are_the_next_power_of_two():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(200, 128, generator=g) * torch.logspace(-3, 3, 200).unsqueeze(1)
    x[0] = 0.0  # an all-zero vector: the amax floor
    x[1, :] = FP8_MAX * 2.0**-5  # amax / 448 exactly a power of two: no rounding up
    codes, scale = quantize_e4m3(x, "ue8m0")
    for row in range(x.shape[0]):
        amax = max(float(x[row].abs().max()), AMAX_FLOOR)
        want = 2.0 ** math.ceil(math.log2(torch.tensor(amax * (1.0 / FP8_MAX), dtype=torch.float32).item()))
        assert scale[row, 0].item() == want, row
    assert scale[1, 0].item() == 2.0**-5
    assert codes.float().abs().max().item() <= FP8_MAX
    assert not codes[0].float().any()


def test_float_scales_map_the_largest_value_to_448():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(50, 64, generator=g) * 3
    codes, scale = quantize_e4m3(x, "float")
    torch.testing.assert_close(scale.squeeze(1), x.abs().amax(1) * (1.0 / FP8_MAX), rtol=0, atol=0)
    assert torch.equal(codes.float().abs().amax(1), torch.full((50,), FP8_MAX))


@pytest.mark.parametrize("fmt", ["ue8m0", "float"])
def test_dequantized_values_are_within_e4m3_rounding(fmt):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 128, generator=g) * torch.rand(64, 1, generator=g) * 10
    codes, scale = quantize_e4m3(x, fmt)
    err = (codes.float() * scale - x).abs()
    # 3 mantissa bits: half a unit in the last place is at most 1/16 of the value (normal codes) or
    # 2^-10 of the scale (subnormal codes)
    assert bool((err <= x.abs() / 16 + scale * 2.0**-10 + 1e-12).all())
    with pytest.raises(ValueError, match="scale_format"):
        quantize_e4m3(x, "e5m2")


@pytest.mark.parametrize("fmt", ["ue8m0", "float"])
def test_scores_equal_an_fp8_gemm(fmt):
    """The folded fp32 operands give the reference's score: ReLU of each head's FP8 GEMM logits,
    times the head's gate and query scale, summed, times the key's scale (torch._scaled_mm runs the
    e4m3 GEMM independently of our folding)."""
    g = torch.Generator().manual_seed(4)
    T, S, H, D = 7, 40, 4, 128
    q, w, k = (
        torch.randn(1, T, H, D, generator=g),
        torch.rand(1, T, H, generator=g) / 16,
        torch.randn(1, S, D, generator=g),
    )
    q8, sq = quantize_e4m3(hadamard(q), fmt)
    k8, sk = quantize_e4m3(hadamard(k), fmt)
    one = torch.tensor(1.0)
    logits = torch._scaled_mm(
        q8.reshape(T * H, D), k8[0].t(), scale_a=one, scale_b=one, out_dtype=torch.float32
    )
    want = (logits.view(T, H, S).relu() * (w[0] * sq[0, ..., 0]).unsqueeze(-1)).sum(1) * sk[0, :, 0]
    fq, fw = fp8_indexer_queries(q, w, fmt)
    got = index_scores(fq, fw, fp8_indexer_keys(k, fmt))[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("path", ["kernel", "torch"])
def test_indexer_topk_fp8_selects_the_fp8_scores_top_k(path):
    g = torch.Generator().manual_seed(5)
    B, T, S, H, D, K = 2, 33, 70, 4, 64, 12
    q, w, k = (
        torch.randn(B, T, H, D, generator=g),
        torch.rand(B, T, H, generator=g) / 8,
        torch.randn(B, S, D, generator=g),
    )
    knobs = {"chunk_size": 8} if path == "torch" else {}
    got = indexer_topk(q, w, k, K, fp8="ue8m0", **knobs)
    fq, fw = fp8_indexer_queries(q, w)
    want = select_topk(index_scores(fq, fw, fp8_indexer_keys(k)), K)
    assert torch.equal(got.sort(-1).values, want.sort(-1).values)


def test_fp8_selection_stays_close_to_the_exact_one():
    """FP8 scoring perturbs scores by e4m3's ~3% rounding: the selection mostly survives."""
    g = torch.Generator().manual_seed(6)
    T, S, H, D, K = 64, 2048, 4, 128, 256
    q, w, k = (
        torch.randn(1, T, H, D, generator=g),
        torch.rand(1, T, H, generator=g),
        torch.randn(1, S, D, generator=g),
    )
    exact = indexer_topk(q, w, k, K)
    fp8 = indexer_topk(q, w, k, K, fp8="ue8m0")
    overlap = torch.tensor(
        [len(set(a.tolist()) & set(b.tolist())) / K for a, b in zip(exact[0], fp8[0], strict=True)]
    )
    assert overlap.mean().item() > 0.9
    assert not torch.equal(exact.sort(-1).values, fp8.sort(-1).values)  # it does score differently


def test_the_rotation_ignores_the_default_dtype():
    """The cached Hadamard matrix is fp32 even when torch's default dtype is not."""
    x = torch.randn(4, 64)
    want = hadamard(x)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        from dsv32.dsa import fp8

        fp8._hadamard_matrix.cache_clear()
        got = hadamard(x)
    finally:
        torch.set_default_dtype(previous)
        fp8._hadamard_matrix.cache_clear()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=0)
