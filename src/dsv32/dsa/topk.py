"""The exact top-k of DSA's token selection and its tie rule, shared by every selector (the torch
reference, the chunked streaming selector, the CPU and GPU kernels' callers).

The rule: rank keys by index score and, among exactly equal scores, prefer the later key position.
Exact ties are common in the lightning indexer (a key whose ReLU logits are all zero scores exactly
0), and ``torch.topk`` breaks them differently for rows of different length — so without one rule a
prefill and the equivalent decode step could select different sets.

- :func:`tie_break_keys` / :func:`exact_topk`: the rule as int64 sort keys, and one top-k over them;
- :func:`row_topk`: an unsorted fp32 top-k, coarse to fine on long rows;
- :func:`drop_extra_candidate` + :func:`resolve_ties`: from a top-(k+1) to the exact top-k, re-selecting
  only the rows whose k-th score ties the (k+1)-th.
"""

from __future__ import annotations

import math

import torch


def exact_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Top-``min(k, S)`` of ``scores`` ``[..., S]`` (``-inf`` = not selectable → ``-1``) under the
    exact tie-break rule of :func:`tie_break_keys`."""
    S = scores.shape[-1]
    keys = tie_break_keys(scores, torch.arange(S, device=scores.device))
    values, indices = keys.topk(min(k, S), dim=-1)
    return indices.masked_fill_(values < NEG_INF_KEY, -1)


def float_order_key(x: torch.Tensor) -> torch.Tensor:
    """fp32 → int64 with the same order (IEEE bit trick; -0.0 is folded into +0.0)."""
    bits = (x.float() + 0.0).view(torch.int32)
    return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(torch.int64)


# Keys below this value come from -inf scores (invisible or padded keys).
NEG_INF_KEY = int(float_order_key(torch.tensor(float("-inf")))) * 2**32 + 2**32


def tie_break_keys(scores: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Exact lexicographic sort keys ``(score, position)`` as int64: top-k over them ranks by score
    and, among exactly equal scores, prefers the later key position (the rule of this module).
    ``positions`` (int, broadcastable to ``scores``) must be < 2^32.
    """
    return float_order_key(scores) * 2**32 + positions.to(torch.int64)


def row_topk(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
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


def drop_extra_candidate(
    values: torch.Tensor, indices: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From each row's top-(k+1) ``values``/``indices`` (unsorted, modified in place) to its top-k
    ``indices`` (``-1`` for −inf scores), the rows whose k-th score ties the dropped (k+1)-th one
    (``ambiguous``: the exact rule must re-select them, see :func:`resolve_ties`) and that score."""
    low, pos = values.min(dim=-1, keepdim=True)
    ambiguous = ((values == low).sum(-1) >= 2) & (low.squeeze(-1) > float("-inf"))
    values.scatter_(-1, pos, values[..., k:].clone())
    indices.scatter_(-1, pos, indices[..., k:].clone())
    values, indices = values[..., :k], indices[..., :k]
    return indices.masked_fill_(values == float("-inf"), -1), ambiguous, low


def resolve_ties(scores: torch.Tensor, kth: torch.Tensor, k: int) -> torch.Tensor:
    """The exact :func:`~dsv32.dsa.indexer.select_topk` set for rows ``scores`` ``[m, S]`` whose
    ``k``-th largest value ``kth`` ``[m, 1]`` is tied with an unselected key: every key above ``kth``,
    then the latest keys equal to it. One int32 top-k instead of the int64 keys of
    :func:`tie_break_keys`."""
    S = scores.shape[-1]
    pos = torch.arange(S, device=scores.device, dtype=torch.int32).expand_as(scores)
    rank = torch.where(scores > kth, pos + S, torch.where(scores == kth, pos, -1))
    return rank.topk(k, dim=-1, sorted=False).indices
