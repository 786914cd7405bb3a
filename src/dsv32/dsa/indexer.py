"""The lightning indexer (paper Eq. 1) and top-k token selection (Eq. 2).

    I[t, s] = sum_j  w[t, j] * ReLU( q_I[t, j] · k_I[s] )                                 (Eq. 1)

``q_I`` (``n_heads`` heads of ``head_dim``) and the gates ``w`` come from query token t; one key
``k_I[s]`` of ``head_dim`` (shared by all indexer heads) comes from token s. As in the released
model: ``q_I = wq_b(q_input)`` where ``q_input`` is MLA's normalized query latent (or, for models
without a q LoRA such as Llama, the hidden state itself); ``k_I = LayerNorm(wk(h))``; the first
``rope_head_dim`` dims of both get *half-split* RoPE; ``w = weights_proj(h) * n_heads^-0.5`` and the
scores carry ``head_dim^-0.5`` (folded into ``w`` here, which is exact since ReLU is positively
homogeneous). The reference kernel's Hadamard rotation is orthogonal and is skipped (fp32/bf16).

Index scores are always computed in fp32. The indexer never receives gradients from the language
model: callers pass detached inputs (paper §2.1.1, "we detach the indexer input").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from dsv32.dsa.rope import apply_rotary


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

    Ties are broken deterministically in favour of the more recent key (see :func:`tie_break_keys`),
    so prefill, decode and chunked scoring select the same set even where ReLU makes many scores
    exactly zero.
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
    return _exact_topk(scores, k)


def _exact_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Top-``min(k, S)`` of ``scores`` ``[..., S]`` (``-inf`` = not selectable → ``-1``) under the
    exact tie-break rule of :func:`tie_break_keys`."""
    S = scores.shape[-1]
    keys = tie_break_keys(scores, torch.arange(S, device=scores.device))
    values, indices = keys.topk(min(k, S), dim=-1)
    return indices.masked_fill_(values < _NEG_INF_KEY, -1)


def _float_order_key(x: torch.Tensor) -> torch.Tensor:
    """fp32 → int64 with the same order (IEEE bit trick; -0.0 is folded into +0.0)."""
    bits = (x.float() + 0.0).view(torch.int32)
    return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(torch.int64)


# Keys below this value come from -inf scores (invisible or padded keys).
_NEG_INF_KEY = int(_float_order_key(torch.tensor(float("-inf")))) * 2**32 + 2**32


def tie_break_keys(scores: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Exact lexicographic sort keys ``(score, position)`` as int64: top-k over them ranks by score
    and, among exactly equal scores, prefers the later key position.

    Exact ties are common in the lightning indexer (a key whose ReLU logits are all zero scores
    exactly 0), and ``torch.topk`` breaks them differently for rows of different length — so
    without this rule a prefill and the equivalent decode step could select different sets.
    ``positions`` (int, broadcastable to ``scores``) must be < 2^32.
    """
    return _float_order_key(scores) * 2**32 + positions.to(torch.int64)


# Defaults of the chunked indexer (any value gives the same selection; these only trade speed and
# memory). Tuned on a 2-core AVX2 CPU with `python benchmarks/attention.py --tune-indexer`.
INDEXER_QUERY_CHUNK = 128  # queries scored together: the row buffer is chunk × visible keys (fp32)
INDEXER_BLOCK_ELEMS = 1 << 18  # logits per scoring block (chunk · H_I · key block), ~1 MB of fp32
INDEXER_KEY_BLOCK = 512  # smallest key block of a scoring step
INDEXER_TOPK_WINDOW = 1 << 15  # keys scored between two merges of the streaming top-k


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
    rows are re-selected with :func:`tie_break_keys`. A decode query is one matmul over the cache.

    Args:
        q: ``[B, T, H_I, D_I]``; weights: ``[B, T, H_I]``; k_index: ``[B, S, D_I]`` (S >= T);
        topk: keys per query (the result has ``min(topk, S)`` columns).
        key_padding_mask: ``[B, S]`` True for real tokens (padding is never selected).
        chunk_size, key_block, window: tuning knobs (default: the ``INDEXER_*`` constants).

    Scores are computed in fp32 whatever the input dtype (bf16 inputs are upcast chunk by chunk).
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
    K = min(topk, S)
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
    plan = _IndexerPlan(
        keys=keys,
        topk=K,
        offset=S - T,
        padding=padding,
        key_block=key_block or INDEXER_KEY_BLOCK,
        window=window or INDEXER_TOPK_WINDOW,
    )
    with torch.no_grad():  # indices only: nothing here is differentiable
        for start in range(0, T, chunk):
            stop = min(start + chunk, T)
            out[:, start:stop] = plan.select(q[:, start:stop].float(), gates[:, start:stop], start)
    return out


@dataclass
class _IndexerPlan:
    """One :func:`indexer_topk` call: fp32 ``keys`` ``[B, S, D]``, ``offset = S - T`` (query t sees
    keys ``<= t + offset``), ``padding`` ``[B, S]`` True = padded (or None)."""

    keys: torch.Tensor
    topk: int
    offset: int
    padding: torch.Tensor | None
    key_block: int
    window: int
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)

    def buffer(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """A contiguous fp32 work tensor reused across chunks (fresh pages cost more than the math)."""
        numel = math.prod(shape)
        buf = self.buffers.get(name)
        if buf is None or buf.numel() < numel:
            buf = self.buffers[name] = self.keys.new_empty(numel)
        return buf[:numel].view(shape)

    def score(self, q: torch.Tensor, w: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        """Index scores ``[B, n, hi - lo]`` of queries ``q`` ``[B, n, H, D]`` (gates ``w``) against
        keys ``lo .. hi - 1`` (no mask), in key blocks of ``~INDEXER_BLOCK_ELEMS`` logits. The result
        lives in a reused buffer: valid until the next call."""
        B, n, H, D = q.shape
        qv = q.reshape(B, n * H, D)
        wv = w.reshape(B, n, 1, H)
        width = hi - lo
        block = max(self.key_block, INDEXER_BLOCK_ELEMS // (n * H))
        out = self.buffer("rows", (B, n, width))
        for b0 in range(lo, hi, block):
            nb = min(b0 + block, hi) - b0
            logits = self.buffer("logits", (B, n * H, nb))
            torch.matmul(qv, self.keys[:, b0 : b0 + nb].transpose(1, 2), out=logits).relu_()
            if nb == width:  # one block: the gated head-sum writes the rows directly
                torch.matmul(wv, logits.view(B, n, H, nb), out=out.view(B, n, 1, nb))
            else:
                summed = self.buffer("summed", (B, n, 1, nb))
                torch.matmul(wv, logits.view(B, n, H, nb), out=summed)
                out[:, :, b0 - lo : b0 - lo + nb] = summed.view(B, n, nb)
        return out

    def mask(self, scores: torch.Tensor, lo: int, first_query: int) -> torch.Tensor:
        """Set invisible entries of ``scores`` ``[B, n, w]`` (keys ``lo ..``, queries
        ``first_query ..``) to -inf in place: padding, and the causal diagonal block only."""
        n, width = scores.shape[1:]
        if self.padding is not None:
            scores.masked_fill_(self.padding[:, lo : lo + width].unsqueeze(1), float("-inf"))
        # Keys up to first_query + offset are visible to every query of the chunk: no mask there.
        first_partial = first_query + self.offset + 1
        if first_partial < lo + width:
            c0 = max(first_partial, lo)
            cols = torch.arange(c0, lo + width, device=scores.device)
            rows = torch.arange(n, device=scores.device) + first_query + self.offset
            scores[:, :, c0 - lo :].masked_fill_(cols.unsqueeze(0) > rows.unsqueeze(1), float("-inf"))
        return scores

    def select(self, q: torch.Tensor, w: torch.Tensor, first_query: int) -> torch.Tensor:
        """``topk_indices`` ``[B, n, K]`` of queries ``first_query .. first_query + n - 1``."""
        B, n = q.shape[:2]
        K = self.topk
        visible = first_query + n + self.offset  # keys seen by the chunk's last query
        values = indices = None
        for lo in range(0, visible, self.window):
            hi = min(lo + self.window, visible)
            scores = self.mask(self.score(q, w, lo, hi), lo, first_query)
            v, i = _row_topk(scores, min(K + 1, hi - lo))
            i += lo
            if values is not None:  # streaming merge with the running top-(k+1)
                v = torch.cat((values, v), dim=-1)
                v, j = v.topk(min(K + 1, v.shape[-1]), dim=-1, sorted=False)
                i = torch.cat((indices, i), dim=-1).gather(-1, j)
            values, indices = v, i
        if values.shape[-1] <= K:  # the chunk sees at most K keys: all visible ones are selected
            indices.masked_fill_(values == float("-inf"), -1)
            return F.pad(indices, (0, K - values.shape[-1]), value=-1)
        # Drop the (K+1)-th candidate; a tie between it and a kept one makes the row ambiguous.
        low, pos = values.min(dim=-1, keepdim=True)
        ambiguous = ((values == low).sum(-1) >= 2) & (low.squeeze(-1) > float("-inf"))
        values.scatter_(-1, pos, values[..., K:].clone())
        indices.scatter_(-1, pos, indices[..., K:].clone())
        values, indices = values[..., :K], indices[..., :K]
        indices.masked_fill_(values == float("-inf"), -1)
        if bool(ambiguous.any()):
            single_window = visible <= self.window  # then `scores` holds every row's visible keys
            for b in ambiguous.any(dim=1).nonzero().flatten().tolist():
                rows = ambiguous[b].nonzero().flatten()
                if single_window:
                    row_scores = scores[b, rows]
                else:
                    row_scores = self.rescore(q[b, rows], w[b, rows], b, rows + first_query)
                indices[b, rows] = _resolve_ties(row_scores, low[b, rows], K)
        return indices

    def rescore(self, q: torch.Tensor, w: torch.Tensor, b: int, t: torch.Tensor) -> torch.Tensor:
        """Masked scores ``[m, visible]`` of queries ``t`` ``[m]`` (``q`` ``[m, H, D]``) of batch row
        ``b`` over all keys the last of them sees."""
        visible = int(t.max()) + self.offset + 1
        plan = _IndexerPlan(self.keys[b : b + 1], self.topk, self.offset, None, self.key_block, visible)
        scores = plan.score(q.unsqueeze(0), w.unsqueeze(0), 0, visible)[0]
        hidden = torch.arange(visible, device=q.device).unsqueeze(0) > (t + self.offset).unsqueeze(1)
        if self.padding is not None:
            hidden |= self.padding[b, :visible].unsqueeze(0)
        return scores.masked_fill_(hidden, float("-inf"))


def _row_topk(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``topk(k)`` of the last dim of ``scores`` ``[B, n, W]`` (contiguous rows), unsorted.

    Coarse to fine when rows are long: the maxima of groups of ``g`` keys pick the top-``k`` groups,
    and the top-``k`` keys lie inside them (each group holding one of them has a maximum at least as
    large; with ties, the *values* returned are still exactly the top-``k`` multiset). Two top-k calls
    over ``W/g`` and ``k·g`` elements replace one over ``W``: ~2-4× less work at ``W/k`` ≥ 16.
    """
    W = scores.shape[-1]
    g = max(2, round(math.sqrt(W / max(k, 1))))
    if W // g + k * g > 0.6 * W or W // g < k:
        return scores.topk(k, dim=-1, sorted=False)
    B, n = scores.shape[:2]
    G = W // g
    groups = scores[..., : G * g].unflatten(-1, (G, g)).amax(dim=-1)  # [B, n, G]
    top_groups = groups.topk(k, dim=-1, sorted=False).indices
    cand = (top_groups.unsqueeze(-1) * g + torch.arange(g, device=scores.device)).flatten(-2)
    if G * g < W:  # the ragged tail joins the candidates as is
        tail = torch.arange(G * g, W, device=scores.device).expand(B, n, W - G * g)
        cand = torch.cat((cand, tail), dim=-1)
    v, j = scores.gather(-1, cand).topk(k, dim=-1, sorted=False)
    return v, cand.gather(-1, j)


def _resolve_ties(scores: torch.Tensor, kth: torch.Tensor, k: int) -> torch.Tensor:
    """The exact :func:`select_topk` set for rows ``scores`` ``[m, S]`` whose ``k``-th largest value
    ``kth`` ``[m, 1]`` is tied with an unselected key: every key above ``kth``, then the latest keys
    equal to it. One int32 top-k instead of the int64 keys of :func:`tie_break_keys`."""
    S = scores.shape[-1]
    pos = torch.arange(S, device=scores.device, dtype=torch.int32).expand_as(scores)
    rank = torch.where(scores > kth, pos + S, torch.where(scores == kth, pos, -1))
    return rank.topk(k, dim=-1, sorted=False).indices
