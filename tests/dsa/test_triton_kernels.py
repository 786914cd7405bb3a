"""The Triton kernels (CUDA only) against the torch references: fused sparse MLA attention (prefill,
split decode, empty slots, padded rows, a split cache), fused indexer scores and the exact top-k."""

from __future__ import annotations

import pytest
import torch

from dsv32.dsa import (
    index_scores,
    indexer_topk,
    select_topk,
    sparse_mla_attention,
    sparse_mla_attention_reference,
)
from dsv32.dsa.kernels import gpu as tk

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and tk.triton is not None), reason="needs a CUDA GPU and Triton"
)
DEV = "cuda"


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def _selection(B, T, S, K, g, padded=False):
    scores = torch.randn(B, T, S, generator=g)
    pad = None
    if padded:
        pad = torch.ones(B, S, dtype=torch.bool)
        pad[0, : S // 3] = False  # row 0 left-padded
    return select_topk(scores, K, key_padding_mask=pad).to(DEV)


@pytest.mark.parametrize(
    "B,T,S,H,K",
    [
        (1, 1, 700, 16, 512),
        (2, 1, 300, 20, 256),
        (2, 37, 37, 16, 16),
        (1, 130, 200, 8, 64),
        (2, 64, 64, 16, 80),
    ],
)
@pytest.mark.parametrize("padded", [False, True])
def test_sparse_mla_kernel_equals_reference_fp32(B, T, S, H, K, padded):
    g = torch.Generator().manual_seed(B * 1000 + T + S)
    D_V, D_PE = 64, 16
    q = torch.randn(B, T, H, D_V + D_PE, generator=g).to(DEV)
    kv = torch.randn(B, S, D_V + D_PE, generator=g).to(DEV)
    idx = _selection(B, T, S, K, g, padded)
    ref = sparse_mla_attention_reference(q.double(), kv.double(), idx, 0.11, D_V)
    got = tk.sparse_mla_attention_gpu(q, kv[..., :D_V], kv[..., D_V:], idx, 0.11)
    assert got.shape == (B, T, H, D_V) and torch.isfinite(got).all()
    assert _rel(got, ref) < 1e-5
    empty = (idx < 0).all(-1)  # queries that see only padding select nothing and give zeros
    if empty.any():
        assert got[empty].abs().max().item() == 0


def test_sparse_mla_kernel_bf16_and_dispatch_with_split_cache():
    g = torch.Generator().manual_seed(4)
    B, T, S, H, K, D_V, D_PE = 2, 96, 1024, 16, 128, 512, 64
    q = torch.randn(B, T, H, D_V + D_PE, generator=g).to(DEV)
    cache = torch.randn(B, S + 16, D_V + D_PE + 8, generator=g).to(DEV)  # preallocated, sliced
    latent, rope = cache[:, :S, :D_V], cache[:, :S, D_V : D_V + D_PE]
    idx = _selection(B, T, S, K, g)
    ref = sparse_mla_attention_reference(q.double(), torch.cat((latent, rope), -1).double(), idx, 0.05, D_V)
    with torch.no_grad():  # the public function dispatches to the kernel for CUDA tensors
        got = sparse_mla_attention(q, latent, idx, 0.05, D_V, k_rope=rope)
    assert _rel(got, ref) < 1e-5
    got16 = tk.sparse_mla_attention_gpu(q.bfloat16(), latent.bfloat16(), rope.bfloat16(), idx, 0.05)
    assert got16.dtype == torch.bfloat16 and _rel(got16, ref) < 2e-2


@pytest.mark.parametrize("T,S,H,D", [(1, 900, 4, 64), (200, 200, 4, 64), (77, 300, 2, 32)])
def test_index_scores_kernel_equals_reference(T, S, H, D):
    g = torch.Generator().manual_seed(T + S)
    B = 2
    q = torch.randn(B, T, H, D, generator=g).to(DEV)
    w = torch.randn(B, T, H, generator=g).to(DEV)
    k = torch.randn(B, S, D, generator=g).to(DEV)
    ref = index_scores(q.double(), w.double(), k.double())  # [B, T, S], unmasked
    got = tk.index_scores_gpu(q, w, k, 0, T, S - T)
    visible = torch.arange(S, device=DEV).unsqueeze(0) <= (torch.arange(T, device=DEV) + S - T).unsqueeze(1)
    assert torch.isinf(got[:, ~visible]).all() and (got[:, ~visible] < 0).all()
    torch.testing.assert_close(got[:, visible], ref[:, visible], atol=1e-4, rtol=1e-5)


def test_gpu_topk_follows_the_exact_tie_rule():
    """Many exact ties at the K-th score (ReLU zeros): the latest tied keys win, as on the CPU."""
    g = torch.Generator().manual_seed(2)
    scores = torch.randn(3, 40, 500, generator=g).clamp_min(0.0).to(DEV)  # about half exactly 0
    scores[:, :, 450:] = float("-inf")
    for K in (3, 10, 300, 480):  # K = 3: rows 125× longer → the coarse-to-fine selection
        got = tk._topk_exact(scores, K)
        ref = select_topk(scores.cpu(), K, causal=False).to(DEV)
        assert torch.equal(got.sort(-1).values, ref.sort(-1).values)


@pytest.mark.parametrize("budget", [None, 2 * 300 * 37])  # one chunk, or chunks of 37 queries
def test_indexer_topk_gpu_selects_the_reference_set(budget, monkeypatch):
    if budget:
        monkeypatch.setattr(tk, "INDEXER_GPU_BUDGET", budget)
    g = torch.Generator().manual_seed(11)
    B, T, S, H, D, K = 2, 300, 300, 4, 64, 48
    q = torch.randn(B, T, H, D, generator=g).to(DEV)
    w = torch.randn(B, T, H, generator=g).to(DEV)
    k = torch.randn(B, S, D, generator=g).to(DEV)
    pad = torch.ones(B, S, dtype=torch.bool, device=DEV)
    pad[1, :50] = False
    got = indexer_topk(q, w, k, K, key_padding_mask=pad)  # dispatches to the GPU path
    scores = index_scores(q.double(), w.double(), k.double())
    ref = select_topk(scores, K, key_padding_mask=pad)
    same = (got.sort(-1).values == ref.sort(-1).values).all(-1)
    assert same.float().mean().item() > 0.99
    # any differing row differs only between keys whose scores tie to rounding
    for b, t in (~same).nonzero().tolist():
        a, r = set(got[b, t].tolist()) - {-1}, set(ref[b, t].tolist()) - {-1}
        diff = torch.tensor(sorted(a ^ r), device=DEV)
        spread = scores[b, t, diff]
        assert (spread.max() - spread.min()).item() < 1e-4
