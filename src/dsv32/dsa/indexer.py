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

from dataclasses import dataclass

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


def indexer_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    k_index: torch.Tensor,
    topk: int,
    *,
    key_padding_mask: torch.Tensor | None = None,
    chunk_size: int = 256,
) -> torch.Tensor:
    """Score and select in query chunks: memory ``O(chunk · S)``, never ``T × S`` at once.

    Same arguments and result as ``select_topk(index_scores(q, weights, k_index), topk)`` with the
    queries aligned to the end of the keys.
    """
    B, T = q.shape[:2]
    S = k_index.shape[1]
    out = []
    for start in range(0, T, chunk_size):
        stop = min(start + chunk_size, T)
        scores = index_scores(q[:, start:stop], weights[:, start:stop], k_index)
        out.append(
            select_topk(scores, topk, key_padding_mask=key_padding_mask, q_offset=start, total_queries=T)
        )
    if not out:
        return q.new_empty((B, 0, min(topk, S)), dtype=torch.long)
    return torch.cat(out, dim=1)
