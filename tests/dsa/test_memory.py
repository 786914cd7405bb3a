"""The sparse DSA path never allocates an L × L tensor: its peak memory grows about linearly in L at
fixed k (counted exactly from the allocator's events with the torch profiler)."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from dsv32.dsa import indexer_topk, sparse_attention, sparse_mla_attention, sparse_mla_attention_absorbed
from dsv32.dsa.kernels import cpu

TOPK = 32


def _peak_and_largest(fn) -> tuple[int, int]:
    """Peak bytes live at once and the largest single allocation made while ``fn`` runs."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
    )
    live = peak = largest = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
        largest = max(largest, nbytes)
    return peak, largest


def _mla_inputs(L: int, g: torch.Generator):
    return dict(
        iq=torch.randn(1, L, 2, 16, generator=g),
        iw=torch.randn(1, L, 2, generator=g),
        ik=torch.randn(1, L, 16, generator=g),
        q=torch.randn(1, L, 4, 40, generator=g),
        kv=torch.randn(1, L, 40, generator=g),
    )


def _sparse_prefill(x) -> torch.Tensor:
    idx = indexer_topk(x["iq"], x["iw"], x["ik"], TOPK)
    return sparse_mla_attention(x["q"], x["kv"], idx, 0.1, 32)


def _at_most_linear(peaks: dict[int, int]) -> bool:
    """From the shortest to the longest length (4×), the peak grows at most ~linearly (≤ 1.5 × 4;
    an L × L term would grow it ~16×)."""
    lo, hi = min(peaks), max(peaks)
    return peaks[hi] / peaks[lo] <= 1.5 * hi / lo


def test_sparse_prefill_memory_is_linear_in_length():
    g = torch.Generator().manual_seed(0)
    peaks = {}
    with torch.no_grad():
        for L in (1024, 2048, 4096):
            x = _mla_inputs(L, g)
            peak, largest = _peak_and_largest(lambda x=x: _sparse_prefill(x))
            # Fixed-size work buffers (~1 MB) aside, nothing is sized like L × L (even as bool).
            assert largest <= max(1 << 20, L * L // 8), f"an allocation of {largest} bytes at L={L}"
            peaks[L] = peak
    assert _at_most_linear(peaks), peaks
    assert peaks[4096] < 4096 * 4096, peaks  # less than one L × L bool mask


def test_masked_reference_is_quadratic_so_the_measure_can_see_it():
    """The same instrument on the O(L²) reference reports the quadratic growth the fast path avoids."""
    from dsv32.dsa import sparse_mla_attention_reference

    g = torch.Generator().manual_seed(1)
    peaks = {}
    with torch.no_grad():
        for L in (512, 1024):
            x = _mla_inputs(L, g)
            idx = indexer_topk(x["iq"], x["iw"], x["ik"], TOPK)
            peaks[L] = _peak_and_largest(
                lambda x=x, idx=idx: sparse_mla_attention_reference(x["q"], x["kv"], idx, 0.1, 32)
            )[0]
    assert peaks[1024] / peaks[512] > 3.5, peaks


def test_decode_and_gqa_memory_is_linear_in_cache_length():
    g = torch.Generator().manual_seed(2)
    dec, gqa = {}, {}
    with torch.no_grad():
        for L in (2048, 4096, 8192):
            x = _mla_inputs(L, g)

            def decode(x=x):
                idx = indexer_topk(x["iq"][:, -1:], x["iw"][:, -1:], x["ik"], TOPK)
                return sparse_mla_attention(x["q"][:, -1:], x["kv"], idx, 0.1, 32)

            dec[L] = _peak_and_largest(decode)[0]
            q, k, v = (
                torch.randn(1, L // 4, 4, 16),
                torch.randn(1, L // 4, 2, 16),
                torch.randn(1, L // 4, 2, 16),
            )
            idx = indexer_topk(x["iq"][:, : L // 4], x["iw"][:, : L // 4], x["ik"][:, : L // 4], TOPK)
            gqa[L] = _peak_and_largest(lambda q=q, k=k, v=v, idx=idx: sparse_attention(q, k, v, idx, 0.1))[0]
    # Decode scores the whole cache once: a few bytes of workspace per cached token (the cache itself,
    # 160 bytes per token here, is never copied), whether or not the exact tie-break path runs.
    assert all(p < 48 * L + (64 << 10) for L, p in dec.items()), dec
    assert _at_most_linear(gqa), gqa


@pytest.mark.skipif(not cpu.available(), reason="the CPU kernels did not build")
def test_absorbed_mla_keeps_one_chunk_of_absorbed_queries(monkeypatch):
    """On the C kernel's path the ``W_UK``-absorbed queries and the latent outputs exist a chunk at a
    time: no allocation is as large as ``[T, H, C]`` (the largest is the output, ``[T, H, D_v]``)."""
    from dsv32.dsa import attention as attn

    T, H, D, Dv, C, R = 1024, 4, 16, 24, 32, 8
    monkeypatch.setattr(attn, "ABSORBED_CHUNK_BYTES", 2 * H * C * 4 * 64)  # 64 queries
    g = torch.Generator().manual_seed(1)
    q_nope, q_rope = torch.randn(1, T, H, D, generator=g), torch.randn(1, T, H, R, generator=g)
    kv = torch.randn(1, T, C + R, generator=g)
    w = torch.randn(H, D + Dv, C, generator=g) / C**0.5
    idx = indexer_topk(torch.randn(1, T, 4, 16, generator=g), torch.rand(1, T, 4, generator=g),
                       torch.randn(1, T, 16, generator=g), 32)  # fmt: skip
    with torch.no_grad():
        _, largest = _peak_and_largest(
            lambda: sparse_mla_attention_absorbed(
                q_nope, q_rope, kv[..., :C], idx, 0.1, w[:, :D], w[:, D:], k_rope=kv[..., C:]
            )
        )
    assert largest < T * H * C * 4
