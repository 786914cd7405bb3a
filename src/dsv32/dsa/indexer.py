"""The lightning indexer (paper Eq. 1) and top-k token selection (Eq. 2).

    I[t, s] = sum_j  w[t, j] * ReLU( q_I[t, j] · k_I[s] )                                 (Eq. 1)

``q_I`` (``n_heads`` heads of ``head_dim``) and the gates ``w`` come from query token t; one key
``k_I[s]`` of ``head_dim`` (shared by all indexer heads) comes from token s. As in the released
model: ``q_I = wq_b(q_input)`` where ``q_input`` is MLA's normalized query latent (or, for models
without a q LoRA such as Llama, the hidden state itself); ``k_I = LayerNorm(wk(h))``; the first
``rope_head_dim`` dims of both get *half-split* RoPE; ``w = weights_proj(h) * n_heads^-0.5`` and the
scores carry ``head_dim^-0.5`` (folded into ``w`` here, which is exact since ReLU is positively
homogeneous). The reference kernel's Hadamard rotation is orthogonal and is skipped in fp32/bf16;
``indexer_topk(..., fp8=...)`` and :mod:`dsv32.dsa.fp8` reproduce its FP8 scoring.

Index scores are always computed in fp32. The indexer never receives gradients from the language
model: callers pass detached inputs (paper §2.1.1, "we detach the indexer input").
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dsv32.dsa.fp8 import fp8_indexer_keys, fp8_indexer_queries
from dsv32.dsa.kernels import cpu as cpu_kernels
from dsv32.dsa.kernels import gpu as triton_kernels
from dsv32.dsa.rope import apply_rotary
from dsv32.dsa.streaming_topk import (
    INDEXER_KEY_BLOCK,
    INDEXER_QUERY_CHUNK,
    INDEXER_TOPK_WINDOW,
    ChunkedSelector,
)
from dsv32.dsa.topk import exact_topk


@dataclass
class IndexerQueries:
    """Per-query indexer state: ``q`` ``[B, T, H_I, D_I]`` and gates ``weights`` ``[B, T, H_I]`` (fp32,
    with ``H_I^-0.5 * D_I^-0.5`` folded in)."""

    q: torch.Tensor
    weights: torch.Tensor


class LightningIndexer(nn.Module):
    """Eq. 1 with the released model's projections; parameter names follow the HF checkpoint
    (``wq_b``, ``wk``, ``k_norm``, ``weights_proj``).

    Args:
        hidden_size: width of the hidden state ``h`` that feeds ``wk`` and ``weights_proj``.
        n_heads: indexer heads ``H_I``.
        head_dim: indexer head dim ``D_I``.
        rope_head_dim: leading dims of ``q_I``/``k_I`` that get (half-split) RoPE.
        q_input_dim: width of what feeds ``wq_b`` — MLA's ``q_lora_rank`` for V3.2; defaults to
            ``hidden_size`` (a projection of the hidden state, for models without a q LoRA).
    """

    def __init__(
        self,
        hidden_size: int,
        n_heads: int,
        head_dim: int,
        rope_head_dim: int,
        q_input_dim: int | None = None,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        if rope_head_dim > head_dim or rope_head_dim % 2:
            raise ValueError(f"rope_head_dim={rope_head_dim} must be even and <= head_dim={head_dim}")
        self.n_heads = n_heads
        self.head_dim = head_dim
        self.rope_head_dim = rope_head_dim
        self.wq_b = nn.Linear(q_input_dim or hidden_size, n_heads * head_dim, bias=False)
        self.wk = nn.Linear(hidden_size, head_dim, bias=False)
        self.k_norm = nn.LayerNorm(head_dim, eps=eps)
        self.weights_proj = nn.Linear(hidden_size, n_heads, bias=False)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        r = self.rope_head_dim
        if r == 0:
            return x
        if r == x.shape[-1]:  # every dim rotates (HF models' default): no split and re-join
            return apply_rotary(x, cos, sin, interleaved=False)
        return torch.cat((apply_rotary(x[..., :r], cos, sin, interleaved=False), x[..., r:]), dim=-1)

    def project_queries(
        self, hidden: torch.Tensor, q_input: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> IndexerQueries:
        """``hidden`` ``[B, T, hidden]``, ``q_input`` ``[B, T, q_input_dim]``, ``cos``/``sin``
        ``[B or 1, T, rope_head_dim/2]`` → :class:`IndexerQueries`."""
        B, T, _ = hidden.shape
        q = self.wq_b(q_input).view(B, T, self.n_heads, self.head_dim)
        q = self._rope(q, cos.unsqueeze(2), sin.unsqueeze(2))
        # The gates stay in fp32 whatever the model dtype (the checkpoint keeps weights_proj fp32).
        weights = F.linear(hidden.float(), self.weights_proj.weight.float())
        weights = weights * (self.n_heads**-0.5 * self.head_dim**-0.5)
        return IndexerQueries(q=q, weights=weights)

    def project_keys(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``hidden`` ``[B, S, hidden]`` → index keys ``k_I`` ``[B, S, D_I]``."""
        return self._rope(self.k_norm(self.wk(hidden)), cos, sin)

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        q_input: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Dense index scores ``[B, T, T]`` of a sequence against itself (no causal mask applied;
        :func:`select_topk` masks). ``q_input`` defaults to ``hidden``."""
        queries = self.project_queries(hidden, hidden if q_input is None else q_input, cos, sin)
        return index_scores(queries.q, queries.weights, self.project_keys(hidden, cos, sin))


def index_scores(q: torch.Tensor, weights: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Eq. 1, literally: ``q`` ``[B, T, H, D]``, ``weights`` ``[B, T, H]``, ``k`` ``[B, S, D]`` →
    ``I`` ``[B, T, S]`` in fp32 (no causal mask). Memory ``B·T·H·S``: chunk T for long inputs."""
    logits = torch.einsum("bthd,bsd->bths", q.float(), k.float()).relu_()
    return torch.einsum("bths,bth->bts", logits, weights.float())


def visible_mask(
    T: int, S: int, device: torch.device, key_padding_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Boolean ``[B or 1, T, S]``: key s is visible to query t when ``s <= t + S - T`` (the queries
    are the last T of the S positions) and the key is not padding (``key_padding_mask`` ``[B, S]``)."""
    rows = torch.arange(T, device=device).unsqueeze(1)
    cols = torch.arange(S, device=device).unsqueeze(0)
    return _visible(rows, cols, S, T, key_padding_mask)


def _visible(rows, cols, S, T_total, key_padding_mask):
    mask = (cols <= rows + (S - T_total)).unsqueeze(0)
    if key_padding_mask is not None:
        mask = mask & key_padding_mask.bool().unsqueeze(1)
    return mask


def select_topk(
    index_scores: torch.Tensor,
    k: int,
    *,
    key_padding_mask: torch.Tensor | None = None,
    causal: bool = True,
    q_offset: int = 0,
    total_queries: int | None = None,
) -> torch.Tensor:
    """Fine-grained token selection (Eq. 2): the top-``k`` visible keys of every query.

    Args:
        index_scores: ``[B, T, S]`` raw scores; queries aligned to the end of the keys (query t sees
            keys ``s <= t + S - T``), which covers prefill (T == S) and decode (T == 1).
        k: number of keys to keep; the result has ``min(k, S)`` columns.
        key_padding_mask: optional ``[B, S]``, True/1 for real tokens; padding is never selected.
        q_offset, total_queries: for a chunk of queries — rows ``q_offset ..`` of ``total_queries``.

    Returns:
        ``topk_indices`` ``[B, T, min(k, S)]`` (int64). Slots that could not be filled because the
        query sees fewer than k keys hold ``-1``; consumers must ignore them.

    Ties are broken deterministically in favour of the more recent key (see
    :func:`~dsv32.dsa.topk.tie_break_keys`), so prefill, decode and chunked scoring select the same
    set even where ReLU makes many scores exactly zero.
    """
    B, T, S = index_scores.shape
    scores = index_scores.float()
    if causal or key_padding_mask is not None:
        rows = torch.arange(T, device=scores.device).unsqueeze(1) + q_offset
        cols = torch.arange(S, device=scores.device).unsqueeze(0)
        if causal:
            mask = _visible(rows, cols, S, total_queries or T, key_padding_mask)
        else:
            mask = key_padding_mask.bool().unsqueeze(1)
        scores = scores.masked_fill(~mask, float("-inf"))
    return exact_topk(scores, k)


def indexer_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    k_index: torch.Tensor,
    topk: int,
    *,
    key_padding_mask: torch.Tensor | None = None,
    chunk_size: int | None = None,
    key_block: int | None = None,
    window: int | None = None,
    fp8: str | None = None,
) -> torch.Tensor:
    """Score and select in query chunks with a streaming top-k: memory ``O(chunk · min(S, window))``,
    never ``T × S``.

    The same selection as ``select_topk(index_scores(q, weights, k_index), topk, ...)`` with the queries
    aligned to the end of the keys (prefill: T == S; decode: T == 1 against a cache), including its
    exact tie-break rule; only the *order* of the ``K`` slots of a row is unspecified (sort them to
    compare). ``-1`` marks empty slots.

    How: for each chunk of ``chunk_size`` queries, the visible keys are scored block by block —
    ``ReLU(q_I · k_I)`` for all ``H_I`` heads is one matmul ``[chunk·H_I, D_I] × [D_I, block]``
    and the gated head-sum a second one, ``[chunk, 1, H_I] × [chunk, H_I, block]`` — into a row buffer
    of at most ``window`` keys, whose ``top-(k+1)`` is merged into a running top-(k+1). Causal: key
    blocks after the chunk's last query are skipped and only the chunk's diagonal is masked. The extra
    (k+1)-th candidate detects rows whose k-th score ties an unselected one (ReLU zeros); only those
    rows are re-selected by the exact rule (every key above the k-th score, then the latest tied
    ones). Long rows use a coarse-to-fine top-k (group maxima first). A decode query is one matmul
    over the cache.

    Args:
        q: ``[B, T, H_I, D_I]``; weights: ``[B, T, H_I]``; k_index: ``[B, S, D_I]`` (S >= T);
        topk: keys per query (the result has ``min(topk, S)`` columns).
        key_padding_mask: ``[B, S]`` True for real tokens (padding is never selected).
        chunk_size, key_block, window: tuning knobs of the torch path (default: the ``INDEXER_*``
            constants); giving any of them selects the torch path.
        fp8: score as the released model's FP8 indexer does — queries and keys Hadamard-rotated and
            quantized to e4m3 with ``"ue8m0"`` (power-of-two, the FP8 inference config) or
            ``"float"`` scales (:mod:`dsv32.dsa.fp8`); None scores the inputs as they are.

    Scores are computed in fp32 whatever the input dtype (bf16 keys are upcast once, queries chunk by
    chunk). The machinery lives in :mod:`dsv32.dsa.streaming_topk`. On the CPU, when the C kernels
    build (:mod:`dsv32.dsa.kernels.cpu`) and no tuning knob is given, a fused C kernel scores and
    selects instead (same contract and tie rule; scores may differ from the matmul's in the last bits,
    so keys tied to rounding may swap); on CUDA, a Triton kernel. NaN scores have no rank: what such a
    row selects is unspecified and path-dependent, but it is always a valid selection (visible,
    unpadded, distinct keys).
    """
    if q.dim() != 4 or weights.shape != q.shape[:3] or k_index.dim() != 3:
        raise ValueError(
            f"indexer_topk expects q [B, T, H, D], weights [B, T, H], k_index [B, S, D]; got "
            f"{tuple(q.shape)}, {tuple(weights.shape)}, {tuple(k_index.shape)}"
        )
    B, T, H, D = q.shape
    S = k_index.shape[1]
    if k_index.shape[0] != B or k_index.shape[2] != D:
        raise ValueError(f"k_index {tuple(k_index.shape)} does not match q {tuple(q.shape)}")
    if S < T:
        raise ValueError(f"{T} queries but only {S} keys: queries are aligned to the end of the keys")
    try:
        topk = operator.index(topk)  # ints, numpy and 0-d torch integers; not 2.5
    except TypeError:
        raise ValueError(f"topk must be an integer >= 0, got {topk!r}") from None
    if topk < 0:
        raise ValueError(f"topk must be an integer >= 0, got {topk}")
    if key_padding_mask is not None and not cpu_kernels.one_entry_per_key(key_padding_mask, B, S):
        raise ValueError(
            f"key_padding_mask {tuple(key_padding_mask.shape)} must be [B, S] = {(B, S)}, one entry per key "
            "(at a decode step: the whole cache's, not the new token's)"
        )
    K = min(topk, S)
    if fp8 is not None:
        q, weights = fp8_indexer_queries(q, weights, fp8)
        k_index = fp8_indexer_keys(k_index, fp8)
    if triton_kernels.indexer_supported(q, k_index):  # CUDA: fused scoring kernel, exact top-k per chunk
        return triton_kernels.indexer_topk_gpu(q, weights, k_index, topk, key_padding_mask)
    untuned = chunk_size is None and key_block is None and window is None  # the knobs tune the torch path
    if untuned and cpu_kernels.indexer_supported(q, k_index):  # CPU: the C kernel
        with torch.no_grad():  # indices only
            return cpu_kernels.indexer_topk_cpu(q, weights, k_index, topk, key_padding_mask)
    out = torch.empty((B, T, K), dtype=torch.long, device=q.device)
    if T == 0 or K == 0:
        return out
    chunk = chunk_size or INDEXER_QUERY_CHUNK
    keys = k_index.float()
    gates = weights.float()
    padding = None
    if key_padding_mask is not None:
        padding = ~key_padding_mask.bool()
        if not bool(padding.any()):
            padding = None
    plan = ChunkedSelector(
        keys=keys,
        topk=K,
        offset=S - T,
        padding=padding,
        key_block=key_block or INDEXER_KEY_BLOCK,
        window=window or INDEXER_TOPK_WINDOW,
    )
    # indices only: nothing here is differentiable; fp32 scores also inside a bf16 autocast region
    with torch.no_grad(), torch.autocast(q.device.type, enabled=False):
        for start in range(0, T, chunk):
            stop = min(start + chunk, T)
            out[:, start:stop] = plan.select(q[:, start:stop].float(), gates[:, start:stop], start)
    return out
