"""Keep Indexing: the indexer's selection recorded at sampling time and forced in the training forward.

The attention counterpart of Keep Routing (paper §3.1): the engine and the trainer compute index
scores with different kernels, dtypes or (one update behind) weights, so near-tied keys can be
selected differently, and the training forward would then score a sample under another attention
pattern than the one that produced it. Recording what the engine selected and forcing it in training
removes that source of mismatch; the indexer still computes its scores (its KL loss, Eq. 4, is taken
over the forced set).

A selection travels in **row positions**, not batch columns: entry ``[b, t, j]`` is the position of a
selected key within row ``b``'s real tokens (0 = its first real token), ``int32``, −1 for an empty slot
(the query sees fewer than ``k`` keys, or is padding). So it does not depend on how much left padding
a batch gives the row: the engine's batch and the trainer's lay the same row out differently.
Queries that see at most ``k`` keys attend to all of them (the layer runs dense); their record is
every visible key, which is what the indexer would select.
"""

from __future__ import annotations

import torch

from dsv32.errors import DSV32Error


class IndexingError(DSV32Error, ValueError):
    """A selection that cannot be recorded or replayed (wrong shape, a model without DSA in sparse
    mode, a call that cannot record every position)."""


def key_positions(key_padding_mask: torch.Tensor | None, B: int, S: int, device) -> torch.Tensor:
    """``[B, S]`` the row position of every key column (padding columns: the next real one's)."""
    if key_padding_mask is None:
        return torch.arange(S, device=device).expand(B, S)
    return (key_padding_mask.long().cumsum(-1) - 1).clamp_min(0)


def row_offsets(key_padding_mask: torch.Tensor | None, B: int, device) -> torch.Tensor:
    """``[B]`` the column of each row's first real key (0 without padding): row position → column."""
    if key_padding_mask is None:
        return torch.zeros(B, dtype=torch.long, device=device)
    return key_padding_mask.long().argmax(-1)


def to_positions(topk_indices: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Selected key columns ``[B, T, K]`` (−1 empty) → their row positions, ``int32`` (−1 empty)."""
    B, T, K = topk_indices.shape
    valid = topk_indices >= 0
    flat = topk_indices.clamp_min(0).reshape(B, T * K).long()
    pos = positions.gather(1, flat).view(B, T, K)
    return torch.where(valid, pos, -1).to(torch.int32)


def dense_positions(query_positions: torch.Tensor, query_real: torch.Tensor | None, k: int) -> torch.Tensor:
    """The record of queries that attend to every key they see: positions ``0 … p`` of a query at row
    position ``p`` (``query_positions`` ``[B, T]``, each ``< k``), −1-padded to ``k``; all −1 for
    padding queries (``query_real`` ``[B, T]`` False)."""
    j = torch.arange(k, device=query_positions.device, dtype=torch.int32)
    out = torch.where(j <= query_positions[..., None], j, -1)
    if query_real is not None:
        out = out.masked_fill(~query_real[..., None], -1)
    return out


def pad_slots(selection: torch.Tensor, k: int) -> torch.Tensor:
    """``[B, T, K']`` with ``K' <= k`` → ``[B, T, k]`` (−1 padded)."""
    if selection.shape[-1] >= k:
        return selection
    return torch.nn.functional.pad(selection, (0, k - selection.shape[-1]), value=-1)


def to_columns(positions: torch.Tensor, offsets: torch.Tensor, S: int) -> torch.Tensor:
    """Recorded row positions ``[B, T, K]`` (−1 empty) → key columns of a batch whose rows start at
    ``offsets`` ``[B]`` (long, −1 empty). :class:`IndexingError` when a position lies past the keys."""
    cols = positions.long() + offsets.view(-1, 1, 1)
    valid = positions >= 0
    if bool((valid & (cols >= S)).any()):
        raise IndexingError(
            f"a forced selection names a key past the {S} keys of this forward: the selection was "
            "recorded for other sequences (pass the indexing recorded with these rows)"
        )
    return torch.where(valid, cols, -1)
