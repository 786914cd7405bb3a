"""Triton GPU kernels for DSA's two hot paths (forward only: prefill and decode without autograd).

- :func:`sparse_mla_attention_gpu` — MLA's MQA mode over the selected latents, fused: each program
  takes one query and a block of heads, gathers its selected latent rows straight from the cache in
  tiles of ``BLOCK_N`` and runs the scores, an online softmax and the value product in registers and
  shared memory — no gathered copy, no score tensor in device memory. Decoding (few queries, many
  selected keys) splits each query's selection across programs and merges the partial results by
  their log-sum-exp (flash-decoding), so one query still fills the GPU.
- :func:`index_scores_gpu` — the lightning indexer's scores ``Σ_j w_tj · ReLU(q_tj · k_s)`` for a
  block of queries against every key, with the ReLU and the gated head sum fused into the matmul
  loop and the causal mask applied in the kernel; :func:`indexer_topk_gpu` selects with the same
  exact tie-break rule as the torch path, chunk by chunk (memory O(chunk · S)).

:mod:`dsv32.dsa.attention` and :mod:`dsv32.dsa.indexer` dispatch here for CUDA tensors when Triton is
importable (:func:`available`); the torch paths stay the reference the tests hold these to. fp32
inputs use IEEE fp32 products (exact comparisons), bf16/fp16 inputs the tensor cores with fp32
accumulation.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from dsv32.dsa.topk import drop_extra_candidate, exact_topk, resolve_ties, row_topk

try:  # Triton ships with CUDA builds of PyTorch; the CPU build has none
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on CPU-only machines
    triton = None
    tl = None


def available(*tensors: torch.Tensor) -> bool:
    """True when Triton is importable and every tensor lives on a CUDA device."""
    return triton is not None and len(tensors) > 0 and all(t.is_cuda for t in tensors)


@functools.cache
def _sm_count(device_index: int | None) -> int:
    return torch.cuda.get_device_properties(device_index or 0).multi_processor_count


def _pow2(n: int) -> bool:
    return n >= 16 and n & (n - 1) == 0


def mla_supported(q: torch.Tensor, latent: torch.Tensor, rope: torch.Tensor) -> bool:
    """Shapes :func:`sparse_mla_attention_gpu` handles: CUDA tensors, the latent (= value) and rope
    widths powers of two ≥ 16 that add up to the query's."""
    D_V, D_PE = latent.shape[-1], rope.shape[-1]
    return available(q, latent, rope) and q.shape[-1] == D_V + D_PE and _pow2(D_V) and _pow2(D_PE)


if triton is not None:

    @triton.jit
    def _sparse_mla_kernel(
        Q, KV, KR, IDX, OUT, LSE, scale,
        s_qb, s_qt, s_qh, s_kb, s_ks, s_rb, s_rs, s_ib, s_it, s_os, s_ob, s_ot, s_oh, s_ls, s_lb, s_lt,
        T, H, K, keys_per_split,
        D_V: tl.constexpr, D_PE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
        IEEE: tl.constexpr,
    ):  # fmt: skip
        pid_q, pid_h, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        b, t = pid_q // T, pid_q % T
        offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
        offs_v, offs_pe = tl.arange(0, D_V), tl.arange(0, D_PE)
        h_ok = offs_h < H
        q_row = Q + b.to(tl.int64) * s_qb + t.to(tl.int64) * s_qt + offs_h[:, None].to(tl.int64) * s_qh
        q_nope = tl.load(q_row + offs_v[None, :], mask=h_ok[:, None], other=0.0)
        q_pe = tl.load(q_row + D_V + offs_pe[None, :], mask=h_ok[:, None], other=0.0)
        m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, D_V], tl.float32)
        idx_row = IDX + b.to(tl.int64) * s_ib + t.to(tl.int64) * s_it
        kv_batch = KV + b.to(tl.int64) * s_kb
        kr_batch = KR + b.to(tl.int64) * s_rb
        lo = split * keys_per_split
        hi = tl.minimum(lo + keys_per_split, K)
        for n0 in range(lo, hi, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            idx = tl.load(idx_row + offs_n, mask=offs_n < hi, other=-1)
            valid = idx >= 0
            rows = tl.where(valid, idx, 0).to(tl.int64)[:, None]
            kv_nope = tl.load(kv_batch + rows * s_ks + offs_v[None, :], mask=valid[:, None], other=0.0)
            kv_pe = tl.load(kr_batch + rows * s_rs + offs_pe[None, :], mask=valid[:, None], other=0.0)
            if IEEE:
                s = tl.dot(q_nope, tl.trans(kv_nope), input_precision="ieee")
                s += tl.dot(q_pe, tl.trans(kv_pe), input_precision="ieee")
            else:
                s = tl.dot(q_nope, tl.trans(kv_nope))
                s += tl.dot(q_pe, tl.trans(kv_pe))
            s = tl.where(valid[None, :], s * scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing valid yet
            alpha = tl.exp(m_i - m_safe)
            p = tl.exp(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p, kv_nope, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(kv_nope.dtype), kv_nope)
            m_i = m_new
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        o_ptr = OUT + split * s_os + b.to(tl.int64) * s_ob + t.to(tl.int64) * s_ot
        tl.store(
            o_ptr + offs_h[:, None] * s_oh + offs_v[None, :], out.to(OUT.dtype.element_ty), mask=h_ok[:, None]
        )
        lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log(l_i))
        tl.store(LSE + split * s_ls + b * s_lb + t * s_lt + offs_h, lse, mask=h_ok)

    @triton.jit
    def _index_scores_kernel(
        Q, W, KI, OUT, offset, q0, S,
        s_qb, s_qt, s_qh, s_wb, s_wt, s_kb, s_ks, s_ob, s_ot,
        n_rows,
        H_I: tl.constexpr, D_I: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        IEEE: tl.constexpr,
    ):  # fmt: skip
        pid_m, pid_n, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # rows of this chunk
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # key positions
        offs_d = tl.arange(0, D_I)
        m_ok = offs_m < n_rows
        last_visible = q0 + offs_m + offset  # query t sees keys <= t + offset
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        # key blocks wholly after the block's last query are invisible: skip the products
        if pid_n * BLOCK_N <= q0 + (pid_m + 1) * BLOCK_M - 1 + offset:
            k = tl.load(
                KI + b.to(tl.int64) * s_kb + offs_n[:, None].to(tl.int64) * s_ks + offs_d[None, :],
                mask=(offs_n < S)[:, None],
                other=0.0,
            )
            q_rows = Q + b.to(tl.int64) * s_qb + offs_m[:, None].to(tl.int64) * s_qt
            w_rows = W + b.to(tl.int64) * s_wb + offs_m.to(tl.int64) * s_wt
            for h in tl.static_range(H_I):
                q = tl.load(q_rows + h * s_qh + offs_d[None, :], mask=m_ok[:, None], other=0.0)
                w = tl.load(w_rows + h, mask=m_ok, other=0.0).to(tl.float32)
                if IEEE:
                    logits = tl.dot(q, tl.trans(k), input_precision="ieee")
                else:
                    logits = tl.dot(q, tl.trans(k))
                acc += tl.maximum(logits, 0.0) * w[:, None]
        visible = (offs_n[None, :] <= last_visible[:, None]) & (offs_n[None, :] < S)
        acc = tl.where(visible, acc, float("-inf"))
        o_ptr = OUT + b.to(tl.int64) * s_ob + offs_m[:, None].to(tl.int64) * s_ot + offs_n[None, :]
        tl.store(o_ptr, acc, mask=m_ok[:, None] & (offs_n < S)[None, :])


def sparse_mla_attention_gpu(
    q: torch.Tensor,
    latent: torch.Tensor,
    rope: torch.Tensor,
    topk_indices: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Fused :func:`~dsv32.dsa.sparse_mla_attention`: ``q`` ``[B, T, H, D_V + D_PE]`` absorbed
    queries, ``latent`` ``[B, S, D_V]`` (keys' first part and the values) and ``rope`` ``[B, S, D_PE]``
    (may be two views of one cache tensor), ``topk_indices`` ``[B, T, K]`` with ``-1`` = empty →
    ``[B, T, H, D_V]`` in ``q.dtype``; queries without a selected key give zeros."""
    B, T, H, C = q.shape
    K = topk_indices.shape[-1]
    v_dim = latent.shape[-1]
    if K == 0 or T == 0:
        return q.new_zeros(B, T, H, v_dim)
    q, latent, rope, idx = (
        x if x.stride(-1) == 1 else x.contiguous() for x in (q, latent, rope, topk_indices)
    )
    ieee = q.dtype == torch.float32
    # heads per program: each gathered latent tile serves them all, so more heads per program read
    # the cache fewer times (64 is fastest at V3.2's 128 heads, docs/dsa.md; fp32 tests use 16)
    block_h = 64 if H >= 64 and not ieee else 16
    block_n = 32 if ieee else 64
    head_blocks = triton.cdiv(H, block_h)
    sms = _sm_count(q.device.index)
    # Decoding: split each query's selection so that ~2 programs per SM run (flash-decoding).
    splits = 1
    if B * T * head_blocks < sms and block_n < K:
        splits = min(triton.cdiv(K, block_n), max(1, 2 * sms // (B * T * head_blocks)))
    per_split = triton.cdiv(triton.cdiv(K, splits), block_n) * block_n
    splits = triton.cdiv(K, per_split) if K else 1
    out_dtype = q.dtype if splits == 1 else torch.float32
    out = torch.empty((splits, B, T, H, v_dim), device=q.device, dtype=out_dtype)
    lse = torch.empty((splits, B, T, H), device=q.device, dtype=torch.float32)
    grid = (B * T, head_blocks, splits)
    _sparse_mla_kernel[grid](
        q, latent, rope, idx, out, lse, scale,
        q.stride(0), q.stride(1), q.stride(2), latent.stride(0), latent.stride(1), rope.stride(0), rope.stride(1),
        idx.stride(0), idx.stride(1),
        out.stride(0), out.stride(1), out.stride(2), out.stride(3),
        lse.stride(0), lse.stride(1), lse.stride(2),
        T, H, K, per_split,
        D_V=v_dim, D_PE=C - v_dim, BLOCK_H=block_h, BLOCK_N=block_n, IEEE=ieee,
        num_warps=4 if ieee else 8, num_stages=1 if ieee else 2,
    )  # fmt: skip
    if splits == 1:
        return out[0]
    # merge the splits: weights exp(lse_s − max) over the splits that saw a key
    top = lse.amax(0, keepdim=True)
    weights = torch.exp(lse - torch.where(torch.isinf(top), torch.zeros_like(top), top))
    total = weights.sum(0)
    merged = (out * weights.unsqueeze(-1)).sum(0) / torch.where(total > 0, total, 1.0).unsqueeze(-1)
    return merged.to(q.dtype)


def index_scores_gpu(
    q: torch.Tensor,
    weights: torch.Tensor,
    k_index: torch.Tensor,
    q0: int,
    n_rows: int,
    offset: int,
    width: int | None = None,
) -> torch.Tensor:
    """Scores ``[B, n_rows, width]`` (fp32) of queries ``q0 .. q0 + n_rows − 1`` of ``q``
    ``[B, T, H_I, D_I]`` (gates ``weights`` ``[B, T, H_I]``) against the first ``width`` (default all)
    keys of ``k_index`` ``[B, S, D_I]``; keys a query cannot see (``s > t + offset``) are ``-inf``."""
    B, _, H, D = q.shape
    S = k_index.shape[1] if width is None else width
    q = q[:, q0 : q0 + n_rows]
    q = q if q.stride(-1) == 1 else q.contiguous()
    w = weights[:, q0 : q0 + n_rows]
    w = w if w.stride(-1) == 1 else w.contiguous()
    k_index = k_index if k_index.stride(-1) == 1 else k_index.contiguous()
    out = torch.empty((B, n_rows, S), device=q.device, dtype=torch.float32)
    ieee = q.dtype == torch.float32
    block_m, block_n = 64, 64 if ieee else 128
    grid = (triton.cdiv(n_rows, block_m), triton.cdiv(S, block_n), B)
    _index_scores_kernel[grid](
        q, w, k_index, out, offset, q0, S,
        q.stride(0), q.stride(1), q.stride(2), w.stride(0), w.stride(1), k_index.stride(0), k_index.stride(1),
        out.stride(0), out.stride(1),
        n_rows,
        H_I=H, D_I=D, BLOCK_M=block_m, BLOCK_N=block_n, IEEE=ieee,
        num_warps=4, num_stages=1 if ieee else 2,
    )  # fmt: skip
    return out


# fp32 scores per chunk of queries: 2^27 floats (512 MB), so memory stays O(chunk · S).
INDEXER_GPU_BUDGET = 1 << 27
# Rows at least this many times longer than K select coarse to fine (group maxima, then candidates):
# below that one torch.topk over the row is faster, above it the two smaller top-k calls are
# (measured on an H100, docs/dsa.md).
COARSE_TOPK_RATIO = 100


def indexer_topk_gpu(
    q: torch.Tensor,
    weights: torch.Tensor,
    k_index: torch.Tensor,
    topk: int,
    key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`~dsv32.dsa.indexer_topk` on the GPU: fused scores per query chunk over the keys the
    chunk can see (causal: half the scores and top-k work of a full row), then the exact tie-break
    top-k of :func:`~dsv32.dsa.select_topk`. Shapes as there; ``-1`` marks empty slots."""
    B, T, H, D = q.shape
    S = k_index.shape[1]
    K = min(topk, S)
    out = torch.empty((B, T, K), dtype=torch.long, device=q.device)
    if T == 0 or K == 0:
        return out
    q = q.to(k_index.dtype)
    chunk = max(1, min(T, INDEXER_GPU_BUDGET // max(B * S, 1)))
    padding = None if key_padding_mask is None else ~key_padding_mask.bool().unsqueeze(1)
    for start in range(0, T, chunk):
        n = min(chunk, T - start)
        width = start + n + S - T  # keys the chunk's last query sees: later ones are never scored
        scores = index_scores_gpu(q, weights, k_index, start, n, S - T, width)
        if padding is not None:
            scores.masked_fill_(padding[..., :width], float("-inf"))
        chosen = _topk_exact(scores, min(K, width))
        out[:, start : start + n] = F.pad(chosen, (0, K - chosen.shape[-1]), value=-1)
    return out


def _topk_exact(scores: torch.Tensor, K: int) -> torch.Tensor:
    """The :func:`~dsv32.dsa.select_topk` set of every row of ``scores`` ``[B, n, S]`` (``-inf`` =
    not selectable → ``-1``). Few rows (decoding): one top-k over the exact (score, position) keys.
    Many rows: an fp32 top-(K+1) (one ``torch.topk``, or the CPU path's coarse-to-fine top-k for rows
    over :data:`COARSE_TOPK_RATIO` · K keys), and the exact tie rule (every key above the K-th score, then
    the latest equal ones) only for rows whose K-th score ties the (K+1)-th — one host
    synchronization per chunk."""
    B, n, S = scores.shape
    if K >= S or B * n <= 64:
        return exact_topk(scores, K)
    if S >= COARSE_TOPK_RATIO * (K + 1):  # long rows: group maxima first, as on the CPU
        values, indices = row_topk(scores, K + 1)
    else:
        values, indices = scores.topk(K + 1, dim=-1, sorted=False)
    indices, ambiguous, kth = drop_extra_candidate(values, indices, K)
    rows = ambiguous.nonzero(as_tuple=True)
    if rows[0].numel():
        indices[rows] = resolve_ties(scores[rows], kth[rows], K)
    return indices


def indexer_supported(q: torch.Tensor, k_index: torch.Tensor) -> bool:
    """Shapes :func:`indexer_topk_gpu` handles: CUDA tensors, indexer head dim a power of two ≥ 16."""
    return available(q, k_index) and _pow2(q.shape[-1]) and math.prod(q.shape) > 0
