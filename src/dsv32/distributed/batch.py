"""Splitting a step's global batch over the ranks.

A recipe's step is ``grad_accum`` micro-batches of ``batch_size`` sequences, in the order one process
reads them. With ``W`` processes rank ``r`` reads the ``r``-th of ``W`` equal contiguous parts of that
same order, each sequence keeping its micro-batch index (so whatever a trainer derives from that
index, such as the indexer loss's query subsample, is the same at every world size): whole
micro-batches when ``grad_accum`` is a multiple of ``W``, or, say, 2 of the 4 rows of one
micro-batch for 4 × 4 on 8 processes. Every rank must run as many forward passes as the others
(FSDP gathers parameters in each); when equal contiguous parts would not, and ``batch_size`` is a
multiple of ``W``, rank ``r`` reads the ``r``-th row slice of every micro-batch instead; anything
else is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsv32.distributed.group import DistError, World


@dataclass(frozen=True)
class Share:
    """Rows ``start:stop`` of the step's micro-batch ``micro``."""

    micro: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


def rank_share(grad_accum: int, batch_size: int, w: World) -> list[Share]:
    """The parts of a step this rank reads (see the module docstring); :class:`DistError` when the
    global batch does not split evenly."""
    if w.size == 1:
        return [Share(m, 0, batch_size) for m in range(grad_accum)]
    W = w.size
    if (grad_accum * batch_size) % W == 0:
        parts = [_parts(grad_accum, batch_size, W, r) for r in range(W)]
        if len({len(p) for p in parts}) == 1:
            return parts[w.rank]
    if batch_size % W == 0:  # the r-th row slice of every micro-batch
        per = batch_size // W
        return [Share(m, w.rank * per, (w.rank + 1) * per) for m in range(grad_accum)]
    raise DistError(
        f"a step of {grad_accum} micro-batches × {batch_size} sequences does not split over {W} "
        f"processes: make grad_accum or batch_size a multiple of {W}"
    )


def _parts(G: int, B: int, W: int, r: int) -> list[Share]:
    per = G * B // W
    lo, hi = r * per, (r + 1) * per
    return [
        Share(m, max(lo, m * B) - m * B, min(hi, (m + 1) * B) - m * B)
        for m in range(lo // B, (hi - 1) // B + 1)
    ]


def split_evenly(count: int, w: World, what: str) -> range:
    """Items ``[r·count/W, (r+1)·count/W)`` of ``count`` for rank ``r`` (:class:`DistError` unless
    ``count`` is a multiple of the world size)."""
    if count % w.size:
        raise DistError(f"{count} {what} do not split evenly over {w.size} processes")
    per = count // w.size
    return range(w.rank * per, (w.rank + 1) * per)
