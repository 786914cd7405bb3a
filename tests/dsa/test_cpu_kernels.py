"""The C kernels behind the CPU fast paths (dsv32.dsa.kernels.cpu) against the torch references: MLA's
MQA-mode sparse attention, GQA sparse attention and the lightning indexer's exact top-k, on shapes that exercise every tile
remainder, padding, empty slots, strided and heads-major views, decode against a cache; and the fallback
to the torch path when no compiler works."""

from __future__ import annotations

import ctypes
import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv32.dsa import (
    index_scores,
    indexer_topk,
    select_topk,
    sparse_attention,
    sparse_mla_attention,
    sparse_mla_attention_reference,
)
from dsv32.dsa.attention import sparse_attention_reference
from dsv32.dsa.kernels import cpu

pytestmark = pytest.mark.skipif(not cpu._compilers(), reason="no C compiler on this machine")


def test_kernels_build_where_a_compiler_exists():
    assert cpu.available(), "a C compiler exists but the kernels did not build"


def _count_calls(monkeypatch, name: str) -> list:
    """A list that gets one entry per call of ``cpu.<name>`` (which still runs)."""
    calls, original = [], getattr(cpu, name)
    monkeypatch.setattr(cpu, name, lambda *a, **kw: calls.append(1) or original(*a, **kw))
    return calls


def _selection(B: int, T: int, S: int, K: int, g: torch.Generator, empty: float = 0.0) -> torch.Tensor:
    """Random distinct visible keys per query (queries aligned to the end of the keys), -1 where a
    query sees fewer than K, and a share ``empty`` of slots blanked (padding-like)."""
    idx = torch.full((B, T, K), -1, dtype=torch.long)
    for b in range(B):
        for t in range(T):
            seen = t + S - T + 1
            pick = torch.randperm(seen, generator=g)[:K]
            idx[b, t, : pick.numel()] = pick
    if empty:
        idx.masked_fill_(torch.rand(idx.shape, generator=g) < empty, -1)
    return idx


MLA_CASES = [
    # B, T, S, H, latent, rope, v_dim, K, split keys, split query, empty share
    (1, 37, 37, 16, 512, 64, 512, 16, False, False, 0.0),  # V3.2 widths, prefill
    (2, 19, 50, 6, 48, 16, 24, 7, True, True, 0.3),  # head and key-tile remainders, V with an 8-tail
    (3, 1, 90, 3, 32, 8, 32, 100, True, False, 0.0),  # decode, K > S
    (2, 23, 23, 5, 40, 0, 16, 9, False, True, 0.5),  # no rope part, many empty slots
]


@pytest.mark.parametrize("B,T,S,H,Cl,R,V,K,split_keys,split_query,empty", MLA_CASES)
def test_sparse_mla_kernel_equals_reference(
    B, T, S, H, Cl, R, V, K, split_keys, split_query, empty, monkeypatch
):
    g = torch.Generator().manual_seed(B * 1000 + T)
    C = Cl + R
    q = torch.randn(B, T, H, C, generator=g)
    cache = torch.randn(B, S + 5, C + 8, generator=g)  # a strided slice of a longer cache
    kv = cache[:, :S, :C]
    idx = _selection(B, T, S, min(K, S), g, empty)
    idx[0, -1] = -1  # a query with no slot at all attends to nothing
    ref = sparse_mla_attention_reference(q, kv, idx, 0.3, V)
    calls = _count_calls(monkeypatch, "sparse_mla_attention_cpu")
    keys = dict(k_rope=kv[..., Cl:]) if split_keys and R else {}
    latent = kv[..., :Cl] if keys else kv
    if split_query and R:
        q_latent = q[..., :Cl].transpose(1, 2).contiguous().transpose(1, 2)  # heads-major, as einsum gives
        got = sparse_mla_attention(q_latent, latent, idx, 0.3, V, q_rope=q[..., Cl:], **keys)
    else:
        got = sparse_mla_attention(q, latent, idx, 0.3, V, **keys)
    assert calls, "the C kernel did not run"
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert got[0, -1].abs().max() == 0


def test_sparse_mla_kernel_equals_torch_path_on_a_long_prefill():
    g = torch.Generator().manual_seed(5)
    T, H, K = 700, 16, 64
    q = torch.randn(1, T, H, 576, generator=g)
    kv = torch.randn(1, T, 576, generator=g)
    idx = indexer_topk(torch.randn(1, T, 4, 64, generator=g), torch.rand(1, T, 4, generator=g),
                       torch.randn(1, T, 64, generator=g), K)  # fmt: skip
    fast = sparse_mla_attention(q, kv, idx, 0.04, 512)
    with cpu.enabled(False):
        slow = sparse_mla_attention(q, kv, idx, 0.04, 512)
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-5)


GQA_CASES = [
    # B, T, S, H, H_kv, D, D_v, K, empty share
    (1, 1, 300, 9, 3, 64, 64, 48, 0.0),  # SmolLM2's heads, a decode step against a cache
    (3, 1, 90, 4, 4, 16, 24, 100, 0.2),  # batched decode, MHA, K > S, D_v with an 8-tail
    (2, 29, 29, 6, 2, 32, 32, 7, 0.3),  # prefill, 3 query heads per KV head (head-tile remainder)
    (1, 40, 130, 8, 1, 8, 16, 13, 0.5),  # MQA, queries continuing a cache, many empty slots
    (2, 5, 60, 14, 2, 16, 16, 9, 0.2),  # 7 query heads per KV head: the kernel adds a zero head
]


@pytest.mark.parametrize("B,T,S,H,Hkv,D,Dv,K,empty", GQA_CASES)
def test_sparse_gqa_kernel_equals_reference(B, T, S, H, Hkv, D, Dv, K, empty, monkeypatch):
    g = torch.Generator().manual_seed(B * 100 + T)
    q = torch.randn(B, T, H, D, generator=g)
    # an HF cache [B, H_kv, capacity, D] seen as [B, S, H_kv, D]: strided, nothing contiguous but rows
    k = torch.randn(B, Hkv, S + 11, D, generator=g)[:, :, :S].transpose(1, 2)
    v = torch.randn(B, Hkv, S + 11, Dv, generator=g)[:, :, :S].transpose(1, 2)
    idx = _selection(B, T, S, min(K, S), g, empty)
    idx[-1, 0] = -1  # a query with no slot at all attends to nothing
    ref = sparse_attention_reference(q, k, v, idx, 0.2)
    calls = _count_calls(monkeypatch, "sparse_gqa_attention_cpu")
    with torch.no_grad():
        got = sparse_attention(q, k, v, idx, 0.2)
    assert calls, "the C kernel did not run"
    assert torch.equal(got[-1, 0], torch.zeros_like(got[-1, 0]))
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


DECODE_CASES = [
    # B, H, H_kv, D, D_v, S
    (32, 9, 3, 64, 64, 250),  # SmolLM2's heads at 32 rows
    (1, 9, 3, 64, 64, 1),  # one key
    (3, 4, 4, 16, 24, 13),  # MHA (one query head per KV head), D_v with an 8-tail, a partial key tile
    (2, 14, 2, 32, 32, 70),  # 7 query heads per KV head: two value tiles, the second part padding
    (4, 8, 1, 8, 8, 9),  # MQA, the smallest head dim
    (2, 16, 2, 128, 128, 40),  # 8 query heads of 128 dims (Llama-3 8B's shape)
]


def _decode_reference(q, k, v, mask, scale):
    """softmax(q k^T · scale) v over the attended keys in float64, zeros for a row that attends to none."""
    B, H, _, D = q.shape
    G = H // k.shape[1]
    qd, kd, vd = q.double(), k.double().repeat_interleave(G, 1), v.double().repeat_interleave(G, 1)
    scores = (qd @ kd.transpose(-1, -2)) * scale  # [B, H, 1, S]
    if mask is not None:
        scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    p = torch.nan_to_num(scores.softmax(-1), nan=0.0)
    return (p @ vd).transpose(1, 2)  # [B, 1, H, D_v]


def _decode_inputs(B, H, Hkv, D, Dv, S, g, dtype=torch.float32):
    q = torch.randn(B, H, 1, D, generator=g).to(dtype)
    # the engine's growing cache hands out views [B, H_kv, S, D] of buffers with headroom
    k = torch.randn(B, Hkv, S + 5, D, generator=g).to(dtype)[:, :, :S]
    v = torch.randn(B, Hkv, S + 5, Dv, generator=g).to(dtype)[:, :, :S]
    mask = torch.ones(B, S, dtype=torch.bool)
    for b in range(1, B):  # left padding of different lengths
        mask[b, : (b * S) // (B + 1)] = False
    return q, k, v, mask


@pytest.mark.parametrize("B,H,Hkv,D,Dv,S", DECODE_CASES)
@pytest.mark.parametrize("masked", [False, True])
def test_dense_decode_kernel_equals_attention_by_its_definition(B, H, Hkv, D, Dv, S, masked):
    g = torch.Generator().manual_seed(B * 1000 + S)
    q, k, v, mask = _decode_inputs(B, H, Hkv, D, Dv, S, g)
    assert cpu.decode_gqa_supported(q, k, v)
    mask = mask if masked else None
    got = cpu.decode_gqa_attention_cpu(q, k, v, mask, 0.3)
    assert got.shape == (B, 1, H, Dv) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), _decode_reference(q, k, v, mask, 0.3), atol=2e-6, rtol=1e-5)


def test_dense_decode_kernel_in_bf16_reads_bf16_and_rounds_the_fp32_result_once():
    g = torch.Generator().manual_seed(5)
    q, k, v, mask = _decode_inputs(6, 9, 3, 64, 64, 77, g, torch.bfloat16)
    got = cpu.decode_gqa_attention_cpu(q, k, v, mask, 0.125)
    assert got.dtype == torch.bfloat16
    # the fp32 arithmetic of the bf16 values, rounded once to bf16
    want = _decode_reference(q, k, v, mask, 0.125).float().bfloat16()
    assert (got.float() - want.float()).abs().max().item() <= 2**-8 * want.float().abs().max().item()


def test_dense_decode_kernel_gives_zeros_to_a_row_that_attends_to_nothing_and_refuses_a_wrong_mask():
    g = torch.Generator().manual_seed(6)
    q, k, v, mask = _decode_inputs(3, 6, 2, 16, 16, 20, g)
    mask[1] = False
    got = cpu.decode_gqa_attention_cpu(q, k, v, mask, 0.25)
    assert torch.equal(got[1], torch.zeros_like(got[1]))
    torch.testing.assert_close(got.double(), _decode_reference(q, k, v, mask, 0.25), atol=2e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="must be"):
        cpu.decode_gqa_attention_cpu(q, k, v, mask[:, :-1], 0.25)
    with pytest.raises(ValueError, match="must be"):
        cpu.decode_gqa_attention_cpu(q, k, v, mask[:2], 0.25)


def test_dense_decode_kernel_gives_the_same_bits_on_one_thread_or_several():
    """Each (row, KV head) problem is computed whole by one thread, so the split cannot change a bit."""
    g = torch.Generator().manual_seed(7)
    q, k, v, mask = _decode_inputs(8, 9, 3, 64, 64, 100, g, torch.bfloat16)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu.decode_gqa_attention_cpu(q, k, v, mask, 0.125)
        torch.set_num_threads(2)
        two = cpu.decode_gqa_attention_cpu(q, k, v, mask, 0.125)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_dense_decode_kernel_takes_only_what_it_computes():
    g = torch.Generator().manual_seed(8)
    q, k, v, _ = _decode_inputs(2, 6, 2, 16, 16, 10, g)
    assert cpu.decode_gqa_supported(q, k, v)
    assert not cpu.decode_gqa_supported(q.expand(2, 6, 2, 16), k, v)  # two query tokens
    assert not cpu.decode_gqa_supported(q.half(), k.half(), v.half())
    assert not cpu.decode_gqa_supported(q, k.bfloat16(), v)  # mixed dtypes
    assert not cpu.decode_gqa_supported(q[..., :12], k[..., :12], v)  # a head dim not a multiple of 8
    assert not cpu.decode_gqa_supported(q[:, :5], k, v)  # 5 query heads over 2 KV heads
    assert not cpu.decode_gqa_supported(q, k.transpose(-1, -2).contiguous().transpose(-1, -2), v)


def test_sparse_gqa_kernel_equals_torch_path_on_a_long_prefill_and_stays_off_under_autograd(monkeypatch):
    g = torch.Generator().manual_seed(8)
    T, H, Hkv, K = 600, 9, 3, 64
    q = torch.randn(1, T, H, 64, generator=g)
    k, v = torch.randn(1, T, Hkv, 64, generator=g), torch.randn(1, T, Hkv, 64, generator=g)
    idx = indexer_topk(torch.randn(1, T, 4, 64, generator=g), torch.rand(1, T, 4, generator=g),
                       torch.randn(1, T, 64, generator=g), K)  # fmt: skip
    calls = _count_calls(monkeypatch, "sparse_gqa_attention_cpu")
    with torch.no_grad():
        fast = sparse_attention(q, k, v, idx, 0.125)
        with cpu.enabled(False):
            slow = sparse_attention(q, k, v, idx, 0.125)
    assert len(calls) == 1
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-5)
    q.requires_grad_(True)
    trained = sparse_attention(q, k, v, idx, 0.125)  # autograd: the torch path and its backward
    assert len(calls) == 1 and trained.requires_grad
    torch.testing.assert_close(trained.detach(), fast, rtol=1e-5, atol=1e-5)


def test_a_selection_past_the_keys_is_an_index_error_not_a_wild_read():
    g = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(1, 2, 4, 16, generator=g) for _ in range(3))
    kv = torch.randn(1, 2, 32, generator=g)
    bad = torch.tensor([[[0, 1], [1, 2]]])  # key 2 of 2
    with torch.no_grad():
        with pytest.raises(IndexError, match="only 2 keys"):
            sparse_attention(q, k, v, bad, 0.25)
        with pytest.raises(IndexError, match="only 2 keys"):
            sparse_mla_attention(q.repeat(1, 1, 1, 2), kv, bad, 0.25, 16)


def test_inputs_that_disagree_are_a_value_error_not_a_wild_read():
    """Every shape the kernels index by is checked first, on the kernel path and the torch path."""
    g = torch.Generator().manual_seed(11)
    q = torch.randn(2, 4, 4, 32, generator=g)
    idx = torch.tensor([[[0, 1], [1, 2], [2, 3], [3, 0]]] * 2)
    kv = torch.randn(2, 4, 32, generator=g)
    k, v = torch.randn(2, 4, 2, 32, generator=g), torch.randn(2, 4, 2, 32, generator=g)
    mla = [
        (dict(kv=kv[:1]), "disagree on the batch"),  # one key row for two query rows
        (dict(kv=kv[..., :24], k_rope=torch.randn(2, 1, 8, generator=g)), "k_rope"),  # rope keys too short
        (dict(q_rope=torch.randn(2, 4, 4, 8, generator=g), q=q[..., :24], kv=kv[..., :24],
              k_rope=kv[:, :3, 24:]), "k_rope"),
        (dict(v_dim=40), "v_dim=40"),
        (dict(kv=kv.bfloat16()), "one dtype"),
    ]  # fmt: skip
    for chunk in (None, 2):  # the C kernel and the torch path
        for change, says in mla:
            args = dict(q=q, kv=kv, topk_indices=idx, scale=0.2, v_dim=32, chunk_size=chunk) | change
            with torch.no_grad(), pytest.raises(ValueError, match=says):
                sparse_mla_attention(**args)
        for kk, vv in ((k, v[:, :1]), (k[:1], v[:1]), (k[..., :16], v)):  # v rows, batch, head dim
            with torch.no_grad(), pytest.raises(ValueError, match="disagree"):
                sparse_attention(q, kk, vv, idx, 0.2, chunk_size=chunk)
    qi, w, ki = (
        torch.randn(2, 1, 4, 16, generator=g),
        torch.randn(2, 1, 4, generator=g),
        torch.randn(2, 9, 16),
    )
    for mask in (torch.tensor([[True], [False]]), torch.ones(2, 5, dtype=torch.bool)):  # not one per key
        for chunk in (None, 4):
            with pytest.raises(ValueError, match="key_padding_mask"):
                indexer_topk(qi, w, ki, 4, key_padding_mask=mask, chunk_size=chunk)
    one_row = torch.ones(1, 9, dtype=torch.bool)
    one_row[0, 3] = False  # [1, S] applies to every batch row, on both paths
    got = indexer_topk(qi, w, ki, 4, key_padding_mask=one_row)
    assert not (got == 3).any() and torch.equal(
        got.sort(-1).values,
        indexer_topk(qi, w, ki, 4, key_padding_mask=one_row, chunk_size=4).sort(-1).values,
    )
    for topk in (-1, 2.5):
        with pytest.raises(ValueError, match="topk must be an integer"):
            indexer_topk(qi, w, ki, topk)


def test_sparse_gqa_kernel_reads_bf16_and_rounds_the_fp32_result_once(monkeypatch):
    g = torch.Generator().manual_seed(9)
    B, T, S, H, Hkv, K = 2, 20, 70, 8, 2, 24
    q = torch.randn(B, T, H, 64, generator=g).bfloat16()
    k = torch.randn(B, S, Hkv, 64, generator=g).bfloat16()
    v = torch.randn(B, S, Hkv, 64, generator=g).bfloat16()
    idx = _selection(B, T, S, K, g, 0.1)
    ref = sparse_attention_reference(q.float(), k.float(), v.float(), idx, 0.125)
    calls = _count_calls(monkeypatch, "sparse_gqa_attention_cpu")
    with torch.no_grad():
        got = sparse_attention(q, k, v, idx, 0.125)
    assert calls and got.dtype == torch.bfloat16
    err = (got.float() - ref).abs()
    assert (err <= ref.abs() * 2**-8 + 1e-6).all()  # one bf16 rounding of the fp32 result


INDEXER_CASES = [
    # B, T, S, H, D, K, padded
    (2, 300, 300, 4, 64, 48, True),
    (1, 1, 500, 8, 32, 64, False),  # decode
    (2, 50, 80, 4, 64, 100, False),  # K > S: every visible key
    (1, 200, 700, 4, 16, 16, False),  # queries continuing a cache
    (1, 129, 129, 12, 8, 129, True),  # K = S
    (1, 40, 5000, 4, 64, 24, True),  # long rows, small K: top-k bounds from groups of 64 keys
]


@pytest.mark.parametrize("B,T,S,H,D,K,padded", INDEXER_CASES)
def test_indexer_kernel_selects_the_reference_set(B, T, S, H, D, K, padded, monkeypatch):
    g = torch.Generator().manual_seed(T + S)
    q = torch.randn(B, T, H, D, generator=g)
    w = torch.randn(B, T, H, generator=g)
    k = torch.randn(B, S, D, generator=g)
    pad = None
    if padded:
        pad = torch.ones(B, S, dtype=torch.bool)
        pad[-1, : S // 5] = False
    calls = _count_calls(monkeypatch, "indexer_topk_cpu")
    got = indexer_topk(q, w, k, K, key_padding_mask=pad)
    assert calls, "the C kernel did not run"
    scores = index_scores(q.double(), w.double(), k.double())
    ref = select_topk(scores, K, key_padding_mask=pad)
    got_sets, ref_sets = got.sort(-1).values, ref.sort(-1).values
    same = (got_sets == ref_sets).all(-1)
    assert same.float().mean().item() > 0.99
    for b, t in (~same).nonzero().tolist():  # any difference is between keys tied to rounding
        diff = torch.tensor(sorted(set(got[b, t].tolist()) ^ set(ref[b, t].tolist())))
        assert (diff >= 0).all()
        spread = scores[b, t, diff]
        assert (spread.max() - spread.min()).item() < 1e-4
    if pad is not None:
        hidden = ~pad[-1]
        assert not hidden[got[-1].clamp_min(0)][got[-1] >= 0].any(), "padding was selected"


@pytest.mark.parametrize("S", [200, 3000])  # 3000 keys: groups of 64 keys bound the top 20
def test_indexer_kernel_follows_the_exact_tie_rule(S):
    """Most scores are exactly 0 (every ReLU is off): the latest tied keys win, exactly as the
    reference selects them, whatever the row length."""
    g = torch.Generator().manual_seed(3)
    q = -torch.rand(1, 64, 4, 64, generator=g)
    k = torch.rand(1, S, 64, generator=g)
    k[0, ::3] = -k[0, ::3]  # a third of the keys score > 0, the rest exactly 0
    w = torch.rand(1, 64, 4, generator=g)
    got = indexer_topk(q, w, k, 20)
    ref = select_topk(index_scores(q, w, k), 20)
    assert torch.equal(got.sort(-1).values, ref.sort(-1).values)


def test_indexer_kernel_prefill_and_decode_select_the_same_keys():
    g = torch.Generator().manual_seed(9)
    T, K = 400, 32
    q = torch.randn(1, T, 4, 64, generator=g)
    w = torch.randn(1, T, 4, generator=g)
    k = torch.randn(1, T, 64, generator=g)
    prefill = indexer_topk(q, w, k, K)
    for t in (K + 1, 257, T - 1):
        decode = indexer_topk(q[:, t : t + 1], w[:, t : t + 1], k[:, : t + 1], K)
        assert torch.equal(decode[0, 0].sort().values, prefill[0, t].sort().values)


def test_indexer_kernel_equals_torch_path_on_a_long_prefill():
    g = torch.Generator().manual_seed(4)
    T, K = 1500, 128
    q = torch.randn(1, T, 4, 64, generator=g)
    w = torch.randn(1, T, 4, generator=g) * 0.06
    k = torch.randn(1, T, 64, generator=g)
    fast = indexer_topk(q, w, k, K)
    with cpu.enabled(False):
        slow = indexer_topk(q, w, k, K)
    same = (fast.sort(-1).values == slow.sort(-1).values).all(-1)
    assert same.float().mean().item() > 0.995


def test_a_failed_build_falls_back_to_the_torch_path(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu, "_compilers", lambda: ["false"])  # a "compiler" that always fails
    monkeypatch.setenv("DSV32_CACHE_DIR", str(tmp_path))
    cpu._library.cache_clear()
    try:
        with pytest.warns(UserWarning, match="could not build the CPU kernels"):
            assert not cpu.available()
        g = torch.Generator().manual_seed(0)
        q, kv = torch.randn(1, 30, 4, 40, generator=g), torch.randn(1, 30, 40, generator=g)
        idx = _selection(1, 30, 30, 8, g)
        got = sparse_mla_attention(q, kv, idx, 0.2, 32)
        torch.testing.assert_close(got, sparse_mla_attention_reference(q, kv, idx, 0.2, 32))
    finally:
        cpu._library.cache_clear()


def test_the_portable_build_computes_the_same(tmp_path, monkeypatch):
    """The last flag set (plain -O3: no -march=native, so SSE only on x86) is what a machine whose
    compiler rejects the native flags gets; it must build and agree with the torch path."""
    monkeypatch.setattr(cpu, "_FLAG_SETS", (cpu._FLAG_SETS[-1],))
    monkeypatch.setenv("DSV32_CACHE_DIR", str(tmp_path))
    cpu._library.cache_clear()
    try:
        assert cpu.available(), "the portable flag set did not build"
        g = torch.Generator().manual_seed(1)
        B, T, S, H, C, V, K = 2, 21, 40, 5, 48, 24, 9
        q, kv = torch.randn(B, T, H, C, generator=g), torch.randn(B, S, C, generator=g)
        idx = _selection(B, T, S, K, g, empty=0.2)
        torch.testing.assert_close(
            cpu.sparse_mla_attention_cpu(q, kv, None, idx, 0.2, V),
            sparse_mla_attention_reference(q, kv, idx, 0.2, V),
        )
        iq, iw, ik = (
            torch.randn(B, T, 4, 16, generator=g),
            torch.rand(B, T, 4, generator=g),
            torch.randn(B, S, 16, generator=g),
        )
        got = cpu.indexer_topk_cpu(iq, iw, ik, K)
        want = select_topk(index_scores(iq, iw, ik), K)
        assert torch.equal(got.sort(-1).values, want.sort(-1).values)
        dq, dk, dv, dmask = _decode_inputs(3, 14, 2, 24, 16, 19, g)
        torch.testing.assert_close(
            cpu.decode_gqa_attention_cpu(dq, dk, dv, dmask, 0.2).double(),
            _decode_reference(dq, dk, dv, dmask, 0.2),
            atol=2e-6,
            rtol=1e-5,
        )
    finally:
        cpu._library.cache_clear()


def test_a_build_without_openmp_gives_the_same_bits(tmp_path, monkeypatch):
    """Where the compiler has no OpenMP (or its runtime does not load) the decode kernel runs on the
    calling thread: the same arithmetic, so the same bits."""
    g = torch.Generator().manual_seed(9)
    q, k, v, mask = _decode_inputs(5, 9, 3, 64, 64, 60, g, torch.bfloat16)
    threaded = cpu.decode_gqa_attention_cpu(q, k, v, mask, 0.125)
    monkeypatch.setattr(cpu, "_FLAG_SETS", tuple(f for f in cpu._FLAG_SETS if "-fopenmp" not in f))
    monkeypatch.setenv("DSV32_CACHE_DIR", str(tmp_path))
    cpu._library.cache_clear()
    try:
        assert cpu.available()
        assert not cpu._library().openmp
        assert torch.equal(cpu.decode_gqa_attention_cpu(q, k, v, mask, 0.125), threaded)
    finally:
        cpu._library.cache_clear()


def test_the_environment_can_turn_the_kernels_off(monkeypatch):
    monkeypatch.setenv("DSV32_CPU_KERNELS", "0")
    cpu._library.cache_clear()
    try:
        assert not cpu.available()
    finally:
        cpu._library.cache_clear()


@st.composite
def mla_case(draw):
    B = draw(st.integers(1, 3))
    T = draw(st.integers(1, 40))
    S = T + draw(st.sampled_from([0, 0, 4, 60]))
    latent = draw(st.sampled_from([8, 16, 24]))
    return dict(
        B=B, T=T, S=S, H=draw(st.integers(1, 6)), latent=latent, rope=draw(st.sampled_from([0, 8])),
        v_dim=draw(st.sampled_from([v for v in (8, 16, 24) if v <= latent])), topk=draw(st.integers(1, S + 6)),
        empty=draw(st.sampled_from([0.0, 0.0, 0.4])), split=draw(st.booleans()), seed=draw(st.integers(0, 2**16)),
    )  # fmt: skip


@settings(max_examples=60, deadline=None, derandomize=True)
@given(mla_case())
def test_sparse_mla_kernel_equals_reference_on_random_shapes(c):
    g = torch.Generator().manual_seed(c["seed"])
    B, T, S, H, Cl, R, V = c["B"], c["T"], c["S"], c["H"], c["latent"], c["rope"], c["v_dim"]
    q = torch.randn(B, T, H, Cl + R, generator=g)
    kv = torch.randn(B, S, Cl + R, generator=g)
    idx = _selection(B, T, S, min(c["topk"], S), g, c["empty"])
    expected = sparse_mla_attention_reference(q, kv, idx, 0.29, V)
    with torch.no_grad():
        if c["split"] and R:
            got = sparse_mla_attention(
                q[..., :Cl], kv[..., :Cl], idx, 0.29, V, k_rope=kv[..., Cl:], q_rope=q[..., Cl:]
            )
        else:
            got = sparse_mla_attention(q, kv, idx, 0.29, V)
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-5)


def _run_on_the_kernel_pool() -> int:
    return cpu._executor(2).submit(lambda: 7).result(timeout=20)


def test_a_forked_child_gets_a_thread_pool_of_its_own():
    """The parent's pool has no threads in a fork()ed child (e.g. a data-loader worker): the child
    must start its own instead of waiting forever on the copy."""
    import multiprocessing as mp

    assert _run_on_the_kernel_pool() == 7  # the parent's pool exists
    with mp.get_context("fork").Pool(1) as pool:
        assert pool.apply_async(_run_on_the_kernel_pool).get(timeout=60) == 7


def _writes(offset: int):
    """A stand-in kernel: writes one byte at ``offset`` of the work buffer it is given."""

    def kernel(_job: int, address: int) -> None:
        ctypes.memset(address + offset, 0, 1)

    return kernel


def test_work_buffers_are_kept_per_thread_and_size_and_stay_guarded():
    first = [work.address for work in cpu._scratch(2, 4096)]
    cpu._run(_writes(4095), [(0,), (1,)], cpu._scratch(2, 4096))  # the last byte it was given: fine
    assert [work.address for work in cpu._scratch(2, 4096)] == first  # the same buffers again
    other = cpu._scratch(2, 1024)  # another size has buffers of its own, guarded after 1,024 bytes
    assert not {work.address for work in other} & set(first)
    with pytest.raises(RuntimeError, match="wrote past its work buffer"):
        cpu._run(_writes(1024), [(0,), (1,)], other)
    elsewhere = []  # another calling thread never gets this thread's buffers
    thread = threading.Thread(target=lambda: elsewhere.extend(w.address for w in cpu._scratch(1, 4096)))
    thread.start()
    thread.join()
    assert elsewhere[0] not in first
    big = cpu._KEEP_BYTES
    with pytest.raises(RuntimeError, match="wrote past its work buffer"):
        cpu._run(_writes(big + cpu._GUARD - 1), [(0,)], cpu._scratch(1, big))
    assert big not in cpu._kept.by_size  # large buffers are not kept
    for size in range(1, cpu._KEEP_SIZES + 1):  # as many other sizes as are kept push 4096 out
        cpu._scratch(1, size)
    assert len(cpu._kept.by_size) == cpu._KEEP_SIZES and 4096 not in cpu._kept.by_size


@pytest.mark.parametrize("split", [False, True])
def test_bf16_inputs_run_the_kernel_in_fp32_arithmetic(split, monkeypatch):
    """bf16 latents, rope keys and queries are read as they are (no upcast copy) and computed in fp32:
    the result is the fp32 reference on the same values, rounded once to bf16."""
    g = torch.Generator().manual_seed(6)
    B, T, S, H, K = 2, 30, 90, 16, 24
    q = torch.randn(B, T, H, 576, generator=g).bfloat16()
    kv = torch.randn(B, S, 576, generator=g).bfloat16()
    idx = _selection(B, T, S, K, g, 0.2)
    ref = sparse_mla_attention_reference(q.float(), kv.float(), idx, 0.04, 512)
    calls = _count_calls(monkeypatch, "sparse_mla_attention_cpu")
    with torch.no_grad():
        if split:
            got = sparse_mla_attention(q[..., :512], kv[..., :512], idx, 0.04, 512, k_rope=kv[..., 512:],
                                       q_rope=q[..., 512:])  # fmt: skip
        else:
            got = sparse_mla_attention(q, kv, idx, 0.04, 512)
    assert calls and got.dtype == torch.bfloat16
    err = (got.float() - ref).abs()
    assert (err <= ref.abs() * 2**-8 + 1e-6).all()  # one bf16 rounding of the fp32 result


def test_bf16_index_keys_select_like_their_fp32_values():
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, 200, 4, 64, generator=g)
    w = torch.randn(1, 200, 4, generator=g)
    k = torch.randn(1, 200, 64, generator=g).bfloat16()
    got = indexer_topk(q, w, k, 32)
    ref = indexer_topk(q, w, k.float(), 32)
    assert torch.equal(got.sort(-1).values, ref.sort(-1).values)


def test_the_kernels_stay_inside_their_buffers_under_address_sanitizer(tmp_path):
    """Re-run this file's kernel tests with the C code built with -fsanitize=address (torch's own
    allocations get red zones too, via the preloaded runtime): any out-of-bounds read or write fails."""
    import os
    import subprocess
    import sys

    runtime = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True)
    libasan = runtime.stdout.strip()
    if runtime.returncode or not os.path.isabs(libasan) or not os.path.exists(libasan):
        pytest.skip("no AddressSanitizer runtime (libasan) here")
    env = dict(
        os.environ,
        CC="gcc",
        DSV32_CPU_KERNELS_CFLAGS="-fsanitize=address -fno-omit-frame-pointer -g",
        DSV32_CACHE_DIR=str(tmp_path / "cache"),
        LD_PRELOAD=libasan,
        ASAN_OPTIONS=f"detect_leaks=0:log_path={tmp_path / 'asan'}",
    )
    skip = "not sanitizer and not forked and not failed_build and not environment"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__, "-k", skip],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    reports = [p.read_text() for p in tmp_path.glob("asan*")]
    assert not reports, reports[0][:3000]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout


def _absorbed_inputs(B, T, S, H, g, split_rope):
    D, Dv, C, R = 16, 24, 32, 8
    q_nope, q_rope = torch.randn(B, T, H, D, generator=g), torch.randn(B, T, H, R, generator=g)
    kv = torch.randn(B, S, C + R, generator=g)
    w = torch.randn(H, D + Dv, C, generator=g) / C**0.5
    kw = {"k_rope": kv[..., C:]} if split_rope else {}
    return q_nope, q_rope, kv[..., :C] if split_rope else kv, w[:, :D], w[:, D:], kw


@pytest.mark.parametrize(
    "B,T,S,K,split_rope",
    [(2, 300, 300, 40, False), (1, 70, 200, 300, True), (2, 1, 90, 16, True), (1, 50, 50, 64, False)],
)
def test_absorbed_mla_in_query_chunks_equals_the_three_steps(B, T, S, K, split_rope, monkeypatch):
    """``W_UK`` absorption, attention and ``W_UV`` a chunk of queries at a time (chunks that do not
    divide T, queries that see fewer than K keys, K > S, a decode step, empty slots) equal the three
    steps written out on the torch path."""
    from dsv32.dsa import attention as attn
    from dsv32.dsa import sparse_mla_attention_absorbed

    monkeypatch.setattr(attn, "ABSORBED_CHUNK_BYTES", 2 * 4 * 32 * 4 * 32)  # 32 queries at 4 heads
    calls = _count_calls(monkeypatch, "sparse_mla_attention_cpu")
    g = torch.Generator().manual_seed(T + S)
    q_nope, q_rope, kv, w_uk, w_uv, kw = _absorbed_inputs(B, T, S, 4, g, split_rope)
    idx = indexer_topk(torch.randn(B, T, 4, 16, generator=g), torch.rand(B, T, 4, generator=g),
                       torch.randn(B, S, 16, generator=g), K)  # fmt: skip
    idx[-1, T // 2 :: 7, : K // 3] = -1  # some slots empty
    with torch.no_grad():
        fast = sparse_mla_attention_absorbed(q_nope, q_rope, kv, idx, 0.1, w_uk, w_uv, **kw)
        with cpu.enabled(False):
            q_latent = torch.einsum("bthd,hdc->bthc", q_nope, w_uk)
            latent = sparse_mla_attention(q_latent, kv, idx, 0.1, 32, q_rope=q_rope, **kw)
            slow = torch.einsum("bthc,hdc->bthd", latent, w_uv)
    assert len(calls) == B * -(-T // 32), "the queries did not go through the kernel in chunks"
    assert fast.shape == (B, T, 4, 24) and fast.is_contiguous()
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-5)


def test_absorbed_mla_in_bf16_projects_in_fp32(monkeypatch):
    """bf16 inputs: the result matches the fp32 three steps on the same values to bf16 rounding,
    and neither projection runs a bf16 matmul (torch's CPU bf16 matmul is ~70x slower than fp32 on
    CPUs without bf16 units)."""
    from dsv32.dsa import sparse_mla_attention_absorbed

    g = torch.Generator().manual_seed(7)
    B, T, S, K = 2, 90, 90, 24
    q_nope, q_rope, kv, w_uk, w_uv, kw = _absorbed_inputs(B, T, S, 4, g, True)
    q_nope, q_rope, kv, w_uk, w_uv = (t.bfloat16() for t in (q_nope, q_rope, kv, w_uk, w_uv))
    kw = {"k_rope": kw["k_rope"].bfloat16()}
    idx = indexer_topk(torch.randn(B, T, 4, 16, generator=g), torch.rand(B, T, 4, generator=g),
                       torch.randn(B, S, 16, generator=g), K)  # fmt: skip
    dtypes, bmm = [], torch.bmm
    monkeypatch.setattr(torch, "bmm", lambda a, b, **k: dtypes.append((a.dtype, b.dtype)) or bmm(a, b, **k))
    with torch.no_grad():
        fast = sparse_mla_attention_absorbed(q_nope, q_rope, kv, idx, 0.1, w_uk, w_uv, **kw)
    monkeypatch.setattr(torch, "bmm", bmm)
    assert dtypes and all(d == (torch.float32, torch.float32) for d in dtypes), dtypes
    assert fast.dtype == torch.bfloat16
    with torch.no_grad(), cpu.enabled(False):
        q_latent = torch.einsum("bthd,hdc->bthc", q_nope.float(), w_uk.float())
        latent = sparse_mla_attention(
            q_latent, kv.float(), idx, 0.1, 32, q_rope=q_rope.float(), k_rope=kw["k_rope"].float()
        )
        slow = torch.einsum("bthc,hdc->bthd", latent, w_uv.float())
    torch.testing.assert_close(fast.float(), slow, rtol=2e-2, atol=2e-2)


def test_absorbed_mla_is_differentiable():
    from dsv32.dsa import sparse_mla_attention_absorbed

    g = torch.Generator().manual_seed(1)
    q_nope, q_rope, kv, w_uk, w_uv, kw = _absorbed_inputs(1, 200, 200, 4, g, True)
    idx = indexer_topk(torch.randn(1, 200, 4, 16, generator=g), torch.rand(1, 200, 4, generator=g),
                       torch.randn(1, 200, 16, generator=g), 32)  # fmt: skip
    w_uk.requires_grad_(True)
    loss = sparse_mla_attention_absorbed(q_nope, q_rope, kv, idx, 0.1, w_uk, w_uv, **kw).square().sum()
    loss.backward()
    assert w_uk.grad is not None and w_uk.grad.abs().sum() > 0
