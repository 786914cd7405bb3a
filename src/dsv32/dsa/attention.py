"""Attention over the indexer's selection (Eq. 2), in the two layouts DSA is used with.

- **MHA/GQA** (Hugging Face dense models): ``q`` ``[B, T, H, D]``, ``k`` ``[B, S, H_kv, D]``,
  ``v`` ``[B, S, H_kv, D_v]``; the selection is per query token and shared by all heads.
- **MLA, MQA mode** (DeepSeek-V3.2): every selected latent ``c[s]`` ``[C]`` (``kv_lora_rank`` +
  ``qk_rope_head_dim``) is both key and (its first ``v_dim`` dims) value for all heads; the queries are
  already absorbed into latent space, ``q`` ``[B, T, H, C]``.

``topk_indices`` ``[B, T, K]`` (int64) index keys; ``-1`` marks an empty slot (a query that sees fewer
than K keys). Each layout has a readable *reference* (dense scores, masked to the selection — O(T·S),
what transformers does) and a *sparse* path that gathers only the selected entries (O(T·K)), computed
in query chunks to bound memory. Tests hold the sparse paths to the references.

The sparse paths are plain PyTorch (gather with ``index_select`` on a contiguous row view + batched
matmul), chunked so the gathered rows stay in cache and, without autograd, writing into reused
buffers. On CUDA, MLA's path (and the indexer) run fused Triton kernels
(:mod:`dsv32.dsa.kernels.gpu`) behind the same signatures when no gradient is needed.
:func:`prefer_dense` holds the measured crossover below which the masked-dense path (identical
results) is faster than the sparse one. The design and its measurements: docs/dsa.md.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from dsv32.dsa import union
from dsv32.dsa.kernels import cpu as cpu_kernels
from dsv32.dsa.kernels import gpu as triton_kernels
from dsv32.dsa.sparse_autograd import SparseAttentionFunction
from dsv32.dsa.union import query_blocks, token_major, union_softmax

# Gathered rows per chunk (chunk_queries · K): ~4 MB of fp32 MLA latents, so they stay in L3 between
# the gather and the two matmuls. Tuned with `python benchmarks/attention.py --tune`.
GATHER_BUDGET = 1 << 11

# Prefill crossover: below ``DENSE_CROSSOVER_RATIO · k`` keys the masked-dense path (MHA mode, dense
# attention masked to the same top-k: identical results) is faster than the sparse one, because a few
# hundred keys per query are cheaper as one dense matmul than as gathers. That ratio is the torch
# path's (MLA without the C kernel, the GQA layout off the CPU); MLA's C kernel moves the crossover
# down to ``MLA_KERNEL_CROSSOVER_RATIO · k`` and the GQA layout's C kernel (Hugging Face models) to
# ``GQA_KERNEL_CROSSOVER_RATIO · k``. They come from `python benchmarks/attention.py --crossover` and
# `python benchmarks/attention_gqa.py` (the sweeps are in docs/results.md). Machine-dependent:
# re-measure and override per model (``MLA.dense_crossover_ratio``) or here.
DENSE_CROSSOVER_RATIO = 4.6
MLA_KERNEL_CROSSOVER_RATIO = 2.6
GQA_KERNEL_CROSSOVER_RATIO = 2.6

# Training (forward + backward with autograd) has its own crossover: the gather path recomputes its
# chunks in the backward, and SDPA's fused masked kernel backpropagates cheaply, so the masked-dense
# path wins up to ``TRAIN_DENSE_CROSSOVER_RATIO · k`` keys (SmolLM2 layers on the CPU, T 512–4096, k
# 64–512: faster at every T/k <= 8, slower at every T/k >= 16; docs/results.md). It keeps about 4 bytes
# per (query, key) pair of a layer's batch for the backward (SDPA's fused kernel keeps the mask, not
# [H, T, S] probabilities), so it is taken only up to ``MASKED_TRAIN_MAX_PAIRS`` pairs per layer
# (~1 GB; 4 × 8K × 8K, the GPU recipe's, is at the bound).
TRAIN_DENSE_CROSSOVER_RATIO = 12.0
MASKED_TRAIN_MAX_PAIRS = 1 << 28


def prefer_dense(
    num_queries: int,
    num_keys: int,
    topk: int,
    crossover_ratio: float | None = None,
    *,
    mla_kernel: bool = False,
    gqa_kernel: bool = False,
    training: bool = False,
    batch: int = 1,
) -> bool:
    """Whether a prefill of ``num_queries`` queries over ``num_keys`` keys with top-``topk`` selection
    is faster masked-dense than sparse: ``num_keys < crossover_ratio · topk`` (default
    :data:`DENSE_CROSSOVER_RATIO`; :data:`MLA_KERNEL_CROSSOVER_RATIO` or
    :data:`GQA_KERNEL_CROSSOVER_RATIO` when ``mla_kernel`` / ``gqa_kernel`` say the sparse side would
    run that C kernel). ``training`` (forward and backward with autograd): default ratio
    :data:`TRAIN_DENSE_CROSSOVER_RATIO`, and only while the layer's ``batch · num_queries ·
    num_keys`` pairs stay within :data:`MASKED_TRAIN_MAX_PAIRS`. Decoding (one query) always gathers.
    Set the ratio to 0 to always use the sparse path, or to ``float("inf")`` to always use the
    masked-dense one."""
    if training:
        ratio = TRAIN_DENSE_CROSSOVER_RATIO if crossover_ratio is None else crossover_ratio
        pairs = batch * num_queries * num_keys
        return num_queries > 1 and num_keys < ratio * topk and pairs <= MASKED_TRAIN_MAX_PAIRS
    default = (
        MLA_KERNEL_CROSSOVER_RATIO
        if mla_kernel
        else GQA_KERNEL_CROSSOVER_RATIO
        if gqa_kernel
        else DENSE_CROSSOVER_RATIO
    )
    ratio = default if crossover_ratio is None else crossover_ratio
    return num_queries > 1 and num_keys < ratio * topk


def mla_kernel_would_run(x: torch.Tensor) -> bool:
    """Whether MLA's sparse attention on activations like ``x`` would take the C kernel (CPU, fp32 or
    bf16, no autograd, kernels built) — what :func:`prefer_dense` needs to pick its crossover."""
    return (
        x.device.type == "cpu"
        and x.dtype in cpu_kernels.DTYPES
        and not torch.is_grad_enabled()
        and cpu_kernels.available()
    )


def gqa_kernel_would_run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether :func:`sparse_attention` on these inputs would take the C kernel (CPU, fp32 or bf16, no
    autograd, kernels built) — what :func:`prefer_dense` needs to pick its crossover."""
    return not _needs_grad(q, k, v) and cpu_kernels.gqa_supported(q, k, v)


# How sparse attention is computed: "gather" (O(L·k)), "masked" (dense scores masked to the
# selection, the O(L²) reference) or "auto" (masked below the measured crossover, see prefer_dense).
SPARSE_IMPLS = ("auto", "gather", "masked")


def nonempty_rows(mask: torch.Tensor) -> torch.Tensor:
    """Give rows of ``mask`` ``[B, T, S]`` (end-aligned queries) that allow nothing — padded queries —
    their own position, so attention never sees an empty row (NaN, which would reach real tokens
    through ``0 · NaN``)."""
    T, S = mask.shape[-2:]
    own = torch.arange(T, device=mask.device).unsqueeze(1) + (S - T) == torch.arange(S, device=mask.device)
    return mask | (own & ~mask.any(dim=-1, keepdim=True))


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim restricted to ``mask``; rows with no valid entry give all zeros
    (instead of NaN), which is what a padded query needs."""
    scores = scores.float().masked_fill(~mask, float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).min)
    exp = (scores - row_max).exp()
    return exp / exp.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)


def selection_mask(topk_indices: torch.Tensor, S: int) -> torch.Tensor:
    """``[B, T, K]`` indices (``-1`` = empty) → boolean ``[B, T, S]`` membership mask."""
    B, T, _ = topk_indices.shape
    mask = torch.zeros(B, T, S + 1, dtype=torch.bool, device=topk_indices.device)
    # Route the -1 slots to an extra column that is dropped afterwards.
    mask.scatter_(-1, torch.where(topk_indices < 0, S, topk_indices), True)
    return mask[..., :S]


def dense_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Plain attention for the MHA/GQA layout through ``F.scaled_dot_product_attention``.

    ``mask`` ``[B or 1, T, S]`` boolean (True = attend); ``None`` means causal with queries aligned to
    the end of the keys. Returns ``[B, T, H, D_v]``.
    """
    T, S = q.shape[1], k.shape[1]
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    gqa = q.shape[2] != k.shape[2]
    if mask is None and T == S:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale, enable_gqa=gqa)
    else:
        if mask is None:
            mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T).unsqueeze(0)
        out = F.scaled_dot_product_attention(
            qh, kh, vh, attn_mask=mask.unsqueeze(1), scale=scale, enable_gqa=gqa
        )
    return out.transpose(1, 2)


def sparse_attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, topk_indices: torch.Tensor, scale: float
) -> torch.Tensor:
    """MHA/GQA attention restricted to ``topk_indices`` by masking dense scores (O(T·S))."""
    B, T, H, _ = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    kh = k.repeat_interleave(H // Hkv, dim=2)
    vh = v.repeat_interleave(H // Hkv, dim=2)
    scores = torch.einsum("bthd,bshd->bhts", q.float(), kh.float()) * scale
    probs = masked_softmax(scores, selection_mask(topk_indices, S).unsqueeze(1))
    return torch.einsum("bhts,bshd->bthd", probs, vh.float()).to(q.dtype)


def _chunk(K: int, chunk_size: int | None) -> int:
    return chunk_size or max(1, GATHER_BUDGET // max(K, 1))


def _needs_grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _row_view(x: torch.Tensor, grad: bool) -> tuple[torch.Tensor, list[int]]:
    """View ``x`` ``[d0, d1, ..., F]`` as rows: ``(rows [N, F], strides)`` with element
    ``x[i0, i1, ...]`` at ``rows[i0 * strides[0] + i1 * strides[1] + ...]``, over ``x``'s own memory
    when its rows are contiguous (cache slices, transposed heads), so nothing is copied."""
    F_ = x.shape[-1]
    if grad or x.stride(-1) != 1 or any(st % F_ for st, n in zip(x.stride()[:-1], x.shape) if n > 1):
        x = x.contiguous()
        if grad:
            strides, acc = [], 1
            for n in reversed(x.shape[:-1]):
                strides.insert(0, acc)
                acc *= n
            return x.reshape(-1, F_), strides
    strides = [st // F_ if n > 1 else 0 for st, n in zip(x.stride()[:-1], x.shape)]
    n_rows = 1 + sum((n - 1) * st for n, st in zip(x.shape[:-1], strides))
    return x.as_strided((n_rows, F_), (F_, 1)), strides


class _Selection:
    """One query chunk of ``topk_indices`` ``[B, n, K]``: ``rows`` (the indices with -1 slots pointing
    at row 0, for gathering), ``invalid`` ``[B·n, 1, K]`` or None when every slot is filled, and
    ``empty`` ``[B·n, 1, 1]`` (queries with no slot at all, e.g. padding) or None."""

    def __init__(self, idx: torch.Tensor) -> None:
        B, n, K = idx.shape
        bad = idx < 0
        self.rows, self.invalid, self.empty = idx, None, None
        if bool(bad.any()):
            self.rows = idx.clamp_min(0)
            self.invalid = bad.view(B * n, 1, K)
            empty = bad.all(dim=-1)
            if bool(empty.any()):
                self.empty = empty.view(B * n, 1, 1)

    def gather(
        self, rows: torch.Tensor, strides: list[int], heads: int = 0, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Selected rows of a :func:`_row_view` of ``[B, S, F]`` → ``[B·n·K, F]``, or of
        ``[B, S, heads, F]`` → ``[B·heads·n·K, F]`` (head-major: each head's rows together)."""
        B = self.rows.shape[0]
        flat = self.rows * strides[1] + (torch.arange(B, device=self.rows.device) * strides[0]).view(B, 1, 1)
        if heads:
            h = torch.arange(heads, device=flat.device) * strides[2]
            flat = flat.unsqueeze(1) + h.view(1, heads, 1, 1)
        return torch.index_select(rows, 0, flat.view(-1), out=out)

    def softmax(self, scores: torch.Tensor, inplace: bool) -> torch.Tensor:
        """Softmax over the last dim of ``scores`` ``[B·n, h, K]`` (or ``[B, heads, n, h, K]``)
        restricted to the filled slots; empty rows give zeros. fp32 result."""
        if self.invalid is not None:
            invalid, empty = self.invalid, self.empty
            if scores.dim() == 5:
                B, _, n, _, K = scores.shape
                invalid = invalid.view(B, 1, n, 1, K)
                empty = None if empty is None else empty.view(B, 1, n, 1, 1)
            scores = (
                scores.masked_fill_(invalid, float("-inf"))
                if inplace
                else scores.masked_fill(invalid, float("-inf"))
            )
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
            return probs if empty is None else probs.masked_fill(empty, 0.0)
        return torch.softmax(scores, dim=-1, dtype=torch.float32)


class _Buffers:
    """Reused per-chunk buffers when autograd is off (the chunks have equal shapes but the last)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.store: dict[str, torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor | None:
        if not self.enabled:
            return None
        numel = math.prod(shape)
        buf = self.store.get(name)
        if buf is None or buf.numel() < numel:
            buf = self.store[name] = like.new_empty(numel)
        return buf[:numel].view(shape)


def sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    topk_indices: torch.Tensor,
    scale: float,
    chunk_size: int | None = None,
    *,
    union_ratio: float | None = None,
) -> torch.Tensor:
    """MHA/GQA attention that reads only the selected keys/values: O(T·K) work and memory per chunk.

    Shapes as in the module docstring (``k``/``v`` may be strided views — a cache slice, or
    ``[B, H_kv, S, D]`` transposed — and are never copied); returns ``[B, T, H, D_v]`` in ``q.dtype``.
    Differentiable. Per chunk of queries the selected rows are gathered head-major with one
    ``index_select``, so each (query, KV head) is one small matmul ``[G, D] × [D, K]`` shared by its
    ``G`` query heads. Leading queries whose selection is every key they can see (a prefill's first
    K queries) run as causal SDPA instead — the same result without the gather. Without autograd,
    blocks of neighbouring queries whose selections overlap (their union holds at most
    ``union_ratio · K`` keys; default :data:`dsv32.dsa.union.UNION_MAX_RATIO_GQA`, 0 = never) run as one masked
    attention over that union instead (see :mod:`dsv32.dsa.union`); with autograd too. Selections are assumed to hold
    distinct indices, as :func:`~dsv32.dsa.select_topk` returns. On the CPU without autograd (and
    without the tuning knobs ``chunk_size`` / ``union_ratio``) the fused C kernel runs instead
    (:func:`~dsv32.dsa.kernels.cpu.sparse_gqa_attention_cpu`: the same result up to fp32 rounding;
    bf16 inputs get an fp32 softmax and one rounding of the output).
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"expected q [B, T, H, D], k [B, S, H_kv, D], v [B, S, H_kv, D_v]; got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    B, T, H, D = q.shape
    Hkv = k.shape[2]
    if k.shape[:3] != v.shape[:3] or k.shape[0] != B or k.shape[-1] != D:
        raise ValueError(
            f"q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)} disagree: k and v need the same "
            "[B, S, H_kv], and k the batch and head dim of q"
        )
    if H % Hkv:
        raise ValueError(f"{H} query heads are not a multiple of {Hkv} KV heads")
    G, Dv, K = H // Hkv, v.shape[-1], topk_indices.shape[-1]
    grad = _needs_grad(q, k, v)
    out = q.new_empty(B, T, H, Dv)
    if T == 0:
        return out
    # Leading queries that selected every key they see need no gather: causal dense attention.
    first = _selects_all_prefix(topk_indices, k.shape[1])
    if first:
        seen = first + k.shape[1] - T
        out[:, :first] = dense_attention(q[:, :first], k[:, :seen], v[:, :seen], scale)
    if (
        chunk_size is None  # chunk_size and union_ratio tune the torch path
        and union_ratio is None
        and gqa_kernel_would_run(q, k, v)
    ):  # CPU + C kernel: each query reads its selected rows where they are, one pass, fp32 softmax
        if first < T:
            cpu_kernels.sparse_gqa_attention_cpu(
                q[:, first:], k, v, topk_indices[:, first:], scale, out=out[:, first:]
            )
        return out
    step = _chunk(K * Hkv, chunk_size)
    ratio = union.UNION_MAX_RATIO_GQA if union_ratio is None else union_ratio
    if grad:  # recompute-in-backward: memory O(chunk · K), not O(T · K) per layer
        rest = SparseAttentionFunction.apply(q[:, first:], k, v, topk_indices[:, first:], scale, step, ratio)
        return torch.cat((out[:, :first], rest), dim=1) if first else rest
    krows, kstrides = _row_view(k, grad)
    vrows, vstrides = _row_view(v, grad)
    bufs = _Buffers(not grad)

    def gather_chunk(start: int, stop: int) -> None:
        idx = topk_indices[:, start:stop]
        n = idx.shape[1]
        sel = _Selection(idx)
        kg = sel.gather(krows, kstrides, Hkv, bufs.get("k", (B * Hkv * n * K, D), k))
        vg = sel.gather(vrows, vstrides, Hkv, bufs.get("v", (B * Hkv * n * K, Dv), v))
        qc = (q[:, start:stop] * scale).view(B, n, Hkv, G, D).transpose(1, 2)  # [B, Hkv, n, G, D]
        scores = torch.bmm(
            qc.reshape(B * Hkv * n, G, D),
            kg.view(B * Hkv * n, K, D).transpose(1, 2),
            out=bufs.get("s", (B * Hkv * n, G, K), kg),
        )
        probs = sel.softmax(scores.view(B, Hkv, n, G, K), inplace=True).to(v.dtype)
        oc = torch.bmm(probs.view(B * Hkv * n, G, K), vg.view(B * Hkv * n, K, Dv))  # [B·Hkv·n, G, Dv]
        out[:, start:stop] = oc.view(B, Hkv, n, G, Dv).transpose(1, 2).reshape(B, n, H, Dv)

    def union_block(start: int, stop: int, b: int, keys: torch.Tensor, selected: torch.Tensor) -> None:
        n, U = stop - start, keys.numel()
        scores, _, _ = union.union_scores(q, k, b, start, stop, keys, selected, scale)
        probs = union_softmax(scores, selected.view(1, n, 1, U)).to(v.dtype).view(Hkv, n * G, U)
        vu = v[b].index_select(0, keys).transpose(0, 1)  # [Hkv, U, Dv]
        out[b, start:stop] = token_major(torch.bmm(probs, vu), n)

    for start, stop, unions in query_blocks(topk_indices, first, H, ratio, step):
        if unions is None:
            gather_chunk(start, stop)
        else:
            for b, (keys, selected) in enumerate(unions):
                union_block(start, stop, b, keys, selected)
    return out


def sparse_mla_attention_reference(
    q: torch.Tensor, kv: torch.Tensor, topk_indices: torch.Tensor, scale: float, v_dim: int
) -> torch.Tensor:
    """MQA-mode MLA attention restricted to the selection by masking dense scores (O(T·S)).

    ``q`` ``[B, T, H, C]`` (absorbed queries), ``kv`` ``[B, S, C]`` (latent + rope key) →
    ``[B, T, H, v_dim]`` (attention-weighted latents)."""
    scores = torch.einsum("bthc,bsc->bhts", q.float(), kv.float()) * scale
    probs = masked_softmax(scores, selection_mask(topk_indices, kv.shape[1]).unsqueeze(1))
    return torch.einsum("bhts,bsc->bthc", probs, kv[..., :v_dim].float()).to(q.dtype)


def _autocast_inputs(q: torch.Tensor, *others: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """``q`` and ``others`` in the dtype of the autocast region they are in (a model's bf16 queries
    beside its fp32-normed latents), unchanged outside one."""
    kind = q.device.type
    if not torch.is_autocast_enabled(kind):
        return (q, *others)
    dtype = torch.get_autocast_dtype(kind)
    return tuple(t if t is None else t.to(dtype) for t in (q, *others))


def _check_mla_inputs(q, kv, topk_indices, v_dim, k_rope=None, q_rope=None) -> None:
    """The shapes :func:`sparse_mla_attention` needs, as a ``ValueError`` naming the mismatch."""
    if q.dim() != 4 or kv.dim() != 3 or topk_indices.dim() != 3:
        raise ValueError(
            f"expected q [B, T, H, C], kv [B, S, C] and topk_indices [B, T, K]; got {tuple(q.shape)}, "
            f"{tuple(kv.shape)} and {tuple(topk_indices.shape)}"
        )
    B, T = q.shape[:2]
    if kv.shape[0] != B or tuple(topk_indices.shape[:2]) != (B, T):
        raise ValueError(
            f"q {tuple(q.shape)}, kv {tuple(kv.shape)} and topk_indices {tuple(topk_indices.shape)} "
            "disagree on the batch (B) or the queries (T)"
        )
    if k_rope is not None and (k_rope.dim() != 3 or k_rope.shape[:2] != kv.shape[:2]):
        raise ValueError(f"k_rope {tuple(k_rope.shape)} must be [B, S, R] beside kv {tuple(kv.shape)}")
    if q_rope is not None and (q_rope.dim() != 4 or q_rope.shape[:3] != q.shape[:3]):
        raise ValueError(f"q_rope {tuple(q_rope.shape)} must be [B, T, H, R] beside q {tuple(q.shape)}")
    if not 0 < v_dim <= kv.shape[-1]:
        raise ValueError(f"v_dim={v_dim} must be in 1 .. {kv.shape[-1]} (the latent's width)")
    dtypes = {t.dtype for t in (q, kv, k_rope, q_rope) if t is not None}
    if len(dtypes) > 1:
        raise ValueError(f"q, kv (and k_rope, q_rope) must share one dtype, got {sorted(map(str, dtypes))}")


def sparse_mla_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    topk_indices: torch.Tensor,
    scale: float,
    v_dim: int,
    chunk_size: int | None = None,
    *,
    k_rope: torch.Tensor | None = None,
    q_rope: torch.Tensor | None = None,
) -> torch.Tensor:
    """MQA-mode MLA attention over the selected latents only (the V3.2 case): each gathered latent is
    shared by all H heads. O(T·K·H·C). Shapes as :func:`sparse_mla_attention_reference`.

    ``k_rope`` ``[B, S, R]``: give the latent ``kv`` ``[B, S, C - R]`` and the rope keys separately
    (as the model's cache holds them) instead of one concatenated ``[B, S, C]`` tensor — decoding then
    never copies the cache. ``q_rope`` ``[B, T, H, R]``: likewise for the queries (``q`` is then the
    latent part, e.g. the result of the ``W_UK`` absorption, and is not concatenated on the C path).
    ``q``/``kv``/``k_rope`` may be strided views (cache slices, permuted einsum results). Per query the scores are one ``[H, C] × [C, K]`` matmul and the
    output one ``[H, K] × [K, v_dim]``, batched over a chunk of queries; differentiable. On this torch
    path, leading queries that selected every key they see (a prefill's first K) attend densely and
    causally, in query blocks that read only the keys they see (the C kernel reads those rows in place
    and needs no such split). Selections must hold distinct indices. (Unlike :func:`sparse_attention`
    there are no union blocks here: one gathered latent already serves every head, so they do not
    pay — see :mod:`dsv32.dsa.union`.) On CUDA
    without autograd a fused Triton kernel runs instead (:mod:`dsv32.dsa.kernels.gpu`); on the CPU in
    fp32 or bf16 without autograd (and without ``chunk_size``, which tunes the torch path) a fused C
    kernel (:mod:`dsv32.dsa.kernels.cpu`), whose output is a heads-major view. Under ``torch.autocast``
    (bf16 mixed-precision training) the inputs are taken in autocast's dtype, as its matmuls would.
    """
    q, kv, k_rope, q_rope = _autocast_inputs(q, kv, k_rope, q_rope)
    _check_mla_inputs(q, kv, topk_indices, v_dim, k_rope, q_rope)
    grad = _needs_grad(q, kv, k_rope, q_rope)
    if (
        chunk_size is None  # chunk_size tunes the torch path
        and not grad
        and q.shape[1] > 0
        and cpu_kernels.mla_supported(q, kv, k_rope, v_dim, q_rope)
    ):  # CPU + C kernel: cache and query parts are read where they are, nothing is concatenated
        return cpu_kernels.sparse_mla_attention_cpu(q, kv, k_rope, topk_indices, scale, v_dim, q_rope=q_rope)
    if q_rope is not None:
        q = torch.cat((q, q_rope), dim=-1)
    B, T, H, C = q.shape
    K = topk_indices.shape[-1]
    Cl = kv.shape[-1]
    if (k_rope is None and Cl != C) or (k_rope is not None and Cl + k_rope.shape[-1] != C):
        raise ValueError(f"q has {C} dims per head but the keys have {Cl} (+ k_rope)")
    if (
        not grad and T > 0 and triton_kernels.available(q)
    ):  # CUDA + Triton: the fused kernel reads latents straight from the cache
        latent, rope = (kv[..., :v_dim], kv[..., v_dim:]) if k_rope is None else (kv, k_rope)
        if latent.shape[-1] == v_dim and triton_kernels.mla_supported(q, latent, rope):
            return triton_kernels.sparse_mla_attention_gpu(q, latent, rope, topk_indices, scale)
    if k_rope is not None and kv.shape[1] <= T * K:  # prefill: one concatenated copy gathers faster
        kv, k_rope = torch.cat((kv, k_rope), dim=-1), None
        Cl = C
    out = q.new_empty(B, T, H, v_dim)
    if T == 0:
        return out
    # Leading queries that selected every key they see need no gather: causal dense attention.
    first = 0 if k_rope is not None else _selects_all_prefix(topk_indices, kv.shape[1])
    if first:
        out[:, :first] = _causal_dense_mla(q[:, :first], kv, scale, v_dim, kv.shape[1] - T)
    step = _chunk(K, chunk_size)
    rows, strides = _row_view(kv, grad)
    if k_rope is not None:
        rrows, rstrides = _row_view(k_rope, grad)
    bufs = _Buffers(not grad)

    def gather_chunk(start: int, stop: int) -> None:
        idx = topk_indices[:, start:stop]
        n = idx.shape[1]
        sel = _Selection(idx)
        g = sel.gather(rows, strides, out=bufs.get("kv", (B * n * K, Cl), kv)).view(B * n, K, Cl)
        qc = (q[:, start:stop] * scale).reshape(B * n, H, C)
        scores = torch.bmm(qc[..., :Cl], g.transpose(1, 2), out=bufs.get("s", (B * n, H, K), g))
        if k_rope is not None:
            gr = sel.gather(rrows, rstrides, out=bufs.get("kr", (B * n * K, C - Cl), k_rope))
            gr = gr.view(B * n, K, C - Cl)
            rope = qc[..., Cl:]
            scores = (
                scores.baddbmm_(rope, gr.transpose(1, 2))
                if not grad
                else scores.baddbmm(rope, gr.transpose(1, 2))
            )
        probs = sel.softmax(scores, inplace=not grad).to(kv.dtype)
        oc = torch.bmm(probs, g[..., :v_dim])  # [B·n, H, v_dim]
        out[:, start:stop] = oc.view(B, n, H, v_dim)

    for start in range(first, T, step):
        gather_chunk(start, min(start + step, T))
    return out


# Bytes of one chunk's buffers in :func:`sparse_mla_attention_absorbed` on the C path (its absorbed
# queries and latent outputs, 2 · H · C values per query): 64 MB = 1024 queries at 16 heads and
# C = 512 in fp32. Large enough that switching between torch's matmul threads and the kernel's, once
# per chunk, costs little; small enough that the [B, T, H, C] tensors never exist (docs/dsa.md).
ABSORBED_CHUNK_BYTES = 64 << 20


def sparse_mla_attention_absorbed(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    kv: torch.Tensor,
    topk_indices: torch.Tensor,
    scale: float,
    w_uk: torch.Tensor,
    w_uv: torch.Tensor,
    *,
    k_rope: torch.Tensor | None = None,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """MLA attention in MQA mode from the per-head queries to the per-head outputs: ``W_UK`` absorbed
    into the queries, :func:`sparse_mla_attention` over the selected latents, ``W_UV`` applied to the
    result — how V3.2 attends with DSA.

    ``q_nope`` ``[B, T, H, D]``, ``q_rope`` ``[B, T, H, R]``; ``kv`` ``[B, S, C]`` latents (with
    ``k_rope`` ``[B, S, R]`` beside them, or their rope part appended when ``k_rope`` is None);
    ``w_uk`` ``[H, D, C]`` and ``w_uv`` ``[H, D_v, C]`` (``kv_b_proj``'s weight viewed per head) →
    ``[B, T, H, D_v]``. Differentiable (then the same as the three steps written out). On the CPU
    kernel's path (no autograd, fp32/bf16) the three steps run a chunk of queries at a time into
    reused buffers of ``ABSORBED_CHUNK_BYTES``, so the ``[B, T, H, C]`` absorbed queries and latent
    outputs (1 GB each at 32K tokens and 16 heads) never exist; ``chunk_size`` tunes the torch path as in
    :func:`sparse_mla_attention`.
    """
    C = w_uk.shape[-1]
    if (
        chunk_size is None
        and not _needs_grad(q_nope, q_rope, kv, k_rope, w_uk, w_uv)
        and q_nope.shape[1] > 0
        and w_uk.dtype == w_uv.dtype == q_nope.dtype
        # the kernel's query is the absorbed one, [.., C] in q_nope's dtype: checked through an empty stand-in
        and cpu_kernels.mla_supported(q_nope.new_empty(0, 0, 0, C), kv, k_rope, C, q_rope)
    ):
        return _absorbed_mla_cpu(q_nope, q_rope, kv, topk_indices, scale, w_uk, w_uv, k_rope)
    q_latent = torch.einsum("bthd,hdc->bthc", q_nope, w_uk)
    latent_out = sparse_mla_attention(
        q_latent, kv, topk_indices, scale, C, chunk_size, k_rope=k_rope, q_rope=q_rope
    )
    return torch.einsum("bthc,hdc->bthd", latent_out, w_uv)


def _absorbed_mla_cpu(q_nope, q_rope, kv, topk_indices, scale, w_uk, w_uv, k_rope):
    """:func:`sparse_mla_attention_absorbed` with the C kernel, in query chunks (see there).

    The two projections run in fp32 whatever the input dtype: on CPUs without native bf16/fp16
    units (AVX2) torch's half-precision matmuls are many times slower than fp32 (docs/dsa.md), and an
    fp32 product rounded once is what a half-precision matmul (fp32 accumulation) computes anyway."""
    B, T, H, _ = q_nope.shape
    C, Dv = w_uk.shape[-1], w_uv.shape[1]
    half = q_nope.dtype != torch.float32
    out = q_nope.new_empty(B, T, H, Dv)
    n = min(max(1, ABSORBED_CHUNK_BYTES // (8 * H * C)), T)  # two [H, n, C] buffers' worth of fp32
    q_buf = q_nope.new_empty(H, n, C)  # one chunk's absorbed queries, heads-major
    o_buf = q_nope.new_empty(H, n, C)  # its attention-weighted latents, heads-major
    fp32 = torch.float32  # explicit: torch.empty's default dtype is a user setting
    wide = torch.empty(H, n, C, dtype=fp32) if half else None  # fp32 side of each projection (half inputs)
    v_buf = torch.empty(H, n, Dv, dtype=fp32)
    w_uk32 = w_uk.float()
    w_uv_t32 = w_uv.transpose(1, 2).float()  # [H, C, Dv]
    for b in range(B):
        for a in range(0, T, n):
            z = min(a + n, T)
            m = z - a
            qc = torch.bmm(
                q_nope[b, a:z].transpose(0, 1).float(), w_uk32, out=(wide if half else q_buf)[:, :m]
            )
            if half:
                qc = q_buf[:, :m].copy_(qc)
            cpu_kernels.sparse_mla_attention_cpu(
                qc.transpose(0, 1).unsqueeze(0), kv[b : b + 1], None if k_rope is None else k_rope[b : b + 1],
                topk_indices[b : b + 1, a:z], scale, C,
                q_rope=q_rope[b : b + 1, a:z], out=o_buf[:, :m].transpose(0, 1).unsqueeze(0),
            )  # fmt: skip
            oc = wide[:, :m].copy_(o_buf[:, :m]) if half else o_buf[:, :m]
            out[b, a:z] = torch.bmm(oc, w_uv_t32, out=v_buf[:, :m]).transpose(0, 1)
    return out


def _selects_all_prefix(topk_indices: torch.Tensor, S: int) -> int:
    """How many leading queries (in every batch row) selected exactly the keys they can see — query t
    sees ``0 .. t + S - T``; true for every query that sees at most K keys when the selection comes from
    :func:`~dsv32.dsa.select_topk` without padding. Their attention is plain causal attention."""
    B, T, K = topk_indices.shape
    offset = S - T
    n = min(T, K - offset)
    if n <= 1:
        return 0
    head = topk_indices[:, :n]
    seen = torch.arange(n, device=head.device) + offset  # last visible key of each query
    full = ((head >= 0).sum(-1) == seen + 1) & (head.amax(-1) <= seen)  # distinct indices assumed
    full = full.all(dim=0)
    return n if bool(full.all()) else int(full.long().cumprod(0).sum())


def _causal_dense_mla(
    q: torch.Tensor, kv: torch.Tensor, scale: float, v_dim: int, offset: int
) -> torch.Tensor:
    """MQA-mode attention of queries ``q`` ``[B, n, H, C]`` (positions ``offset ..``) over every key up
    to their own, in query blocks that read only the keys they can see: ``[B, n, H, v_dim]``."""
    B, n, H, C = q.shape
    out = q.new_empty(B, n, H, v_dim)
    block = max(1, (1 << 20) // (H * (n + offset)))  # ~4 MB of fp32 scores per block
    for a in range(0, n, block):
        b = min(a + block, n)
        keys = kv[:, : b + offset]  # [B, b + offset, C]
        scores = torch.matmul(q[:, a:b].reshape(B, (b - a) * H, C) * scale, keys.transpose(1, 2))
        scores = scores.view(B, b - a, H, b + offset)
        later = torch.arange(b + offset, device=q.device) > (
            torch.arange(a, b, device=q.device) + offset
        ).unsqueeze(1)
        probs = torch.softmax(
            scores.masked_fill(later.view(1, b - a, 1, -1), float("-inf")), dim=-1, dtype=torch.float32
        )
        out[:, a:b] = torch.matmul(probs.to(kv.dtype).view(B, (b - a) * H, -1), keys[..., :v_dim]).view(
            B, b - a, H, v_dim
        )
    return out


def dense_mla_attention(
    q: torch.Tensor, kv: torch.Tensor, scale: float, v_dim: int, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Dense MQA-mode MLA attention (how V3.1 decodes): all visible latents, shared by all heads.

    ``mask`` ``[B or 1, T, S]`` (True = attend); ``None`` = causal, queries aligned to the end."""
    return dense_attention(q, kv.unsqueeze(2), kv[..., :v_dim].unsqueeze(2), scale, mask)
