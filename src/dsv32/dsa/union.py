"""Shared-selection ("union") blocks for top-k sparse attention in the GQA layout.

Neighbouring queries of a trained indexer select mostly the same keys, so a block of them costs less
as one dense matmul over the *union* of its selections, masked to each query's own set, than as
per-query gathers and small ``[G, D] × [D, k]`` products — the same attention, computed with large
matmuls and one gather per block. Each block measures its union and takes the union path when it
holds at most ``ratio · k`` keys; otherwise its queries gather one by one. In MLA's MQA mode one
gathered latent already serves every head, so union blocks do not pay there and MLA always gathers.
The measured speed-ups and the break-even ratio behind :data:`UNION_MAX_RATIO_GQA` are in
docs/dsa.md and docs/results.md (``python benchmarks/attention.py --union-sweep``).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

UNION_BLOCK = 64  # queries per shared-selection block
UNION_SCORE_BUDGET = 1 << 22  # fp32 scores of one block (heads · queries · union), ~16 MB
UNION_MAX_RATIO_GQA = 12.0


def union_block_size(queries: int, heads: int, K: int, ratio: float) -> int:
    """Queries per shared-selection block: :data:`UNION_BLOCK`, fewer when the largest accepted
    union's scores would pass :data:`UNION_SCORE_BUDGET`."""
    return max(8, min(UNION_BLOCK, int(UNION_SCORE_BUDGET // max(1.0, heads * ratio * K)), queries))


def selection_union(idx: torch.Tensor, max_keys: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Union of the selections ``idx`` ``[n, K]`` of one batch row's query block: ``(keys, selected)``
    with the distinct selected key indices ``keys`` ``[U]`` (sorted, ``-1`` dropped) and ``selected``
    ``[n, U]`` (query i selected ``keys[j]``); None when more than ``max_keys`` keys."""
    keys, inverse = torch.unique(idx, return_inverse=True)
    drop = int(keys.numel() > 0 and int(keys[0]) < 0)
    if keys.numel() - drop > max_keys:
        return None
    selected = torch.zeros(idx.shape[0], keys.numel(), dtype=torch.bool, device=idx.device)
    selected.scatter_(1, inverse, True)
    return keys[drop:], selected[:, drop:]


def union_softmax(scores: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
    """Softmax of :func:`union_scores`' ``scores`` (unselected keys already −inf) with ``selected``
    broadcast to them; a query with no selected key (padding) gets zeros, not NaN. fp32."""
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    empty = ~selected.any(dim=-1, keepdim=True)
    return probs.masked_fill_(empty, 0.0) if bool(empty.any()) else probs


def query_blocks(
    topk_indices: torch.Tensor, first: int, heads: int, ratio: float, chunk: int
) -> Iterator[tuple[int, int, list[tuple[torch.Tensor, torch.Tensor]] | None]]:
    """The plan of a sparse attention call over queries ``first ..``: ``(start, stop, unions)`` for
    a union block, with every batch row's :func:`selection_union`, and ``(start, stop, None)`` for the
    other queries (a block where some row's union holds more than ``ratio · K`` keys), in
    per-query-gather chunks of ``chunk``. ``ratio`` 0 (or fewer than 8 queries: a decode step, a
    short tail) gathers everything."""
    T, K = topk_indices.shape[1], topk_indices.shape[2]
    ratio = ratio if T - first >= 8 else 0.0
    block = union_block_size(T - first, heads, K, ratio) if ratio > 0 else max(T - first, 1)
    for start in range(first, T, block):
        stop = min(start + block, T)
        unions = _block_unions(topk_indices[:, start:stop], ratio * K) if ratio > 0 else None
        if unions is not None:
            yield start, stop, unions
        else:
            for s0 in range(start, stop, chunk):
                yield s0, min(s0 + chunk, stop), None


def _block_unions(idx: torch.Tensor, max_keys: float) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """Every batch row's :func:`selection_union` of ``idx`` ``[B, n, K]``, or None when one is too large."""
    unions = []
    for row in idx:
        u = selection_union(row, max_keys)
        if u is None:
            return None
        unions.append(u)
    return unions


def union_scores(q, k, b, start, stop, keys, selected, scale):
    """One union block of ``q`` ``[B, T, H, D]`` over ``k`` ``[B, S, H_kv, D]`` (batch row ``b``,
    queries ``start..stop``, union ``keys`` / ``selected`` of :func:`selection_union`): scores
    ``[Hkv, n, G, U]`` (fp32, unselected keys −inf), the scaled queries ``[Hkv, n·G, D]`` and the
    union's keys ``[Hkv, U, D]``."""
    Hkv = k.shape[2]
    n, G, U = stop - start, q.shape[2] // Hkv, keys.numel()
    ku = k[b].index_select(0, keys).transpose(0, 1)  # [Hkv, U, D]
    qc = heads_major(q[b, start:stop] * scale, Hkv)  # [Hkv, n·G, D]
    scores = torch.bmm(qc, ku.transpose(1, 2)).float().view(Hkv, n, G, U)
    return scores.masked_fill_(~selected.view(1, n, 1, U), float("-inf")), qc, ku


def heads_major(x: torch.Tensor, Hkv: int) -> torch.Tensor:
    """``[n, H, F]`` → ``[Hkv, n·G, F]`` (each KV head's query rows together)."""
    n, H, F_ = x.shape
    return x.view(n, Hkv, H // Hkv, F_).permute(1, 0, 2, 3).reshape(Hkv, -1, F_)


def token_major(x: torch.Tensor, n: int) -> torch.Tensor:
    """``[Hkv, n·G, F]`` → ``[n, H, F]``."""
    Hkv, _, F_ = x.shape
    return x.view(Hkv, n, -1, F_).permute(1, 0, 2, 3).reshape(n, -1, F_)
