"""Splitting a step's global batch over the ranks.

A recipe's step is ``grad_accum`` micro-batches of ``batch_size`` sequences, in the order one process
reads them. With ``W`` processes each rank reads a disjoint part of that same order: whole
micro-batches when ``grad_accum`` is a multiple of ``W`` (rank ``r`` the ``r``-th run of
``grad_accum / W``), else an equal row slice of every micro-batch when ``batch_size`` is. Every
sequence is read once per step and keeps its micro-batch index, so whatever a trainer derives from
that index (the indexer loss's query subsample) is the same at every world size.
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
    W, r = w.size, w.rank
    if W == 1:
        return [Share(m, 0, batch_size) for m in range(grad_accum)]
    if grad_accum % W == 0:
        per = grad_accum // W
        return [Share(m, 0, batch_size) for m in range(r * per, (r + 1) * per)]
    if batch_size % W == 0:
        per = batch_size // W
        return [Share(m, r * per, (r + 1) * per) for m in range(grad_accum)]
    raise DistError(
        f"a step of {grad_accum} micro-batches × {batch_size} sequences does not split over {W} processes: "
        f"make grad_accum or batch_size a multiple of {W}"
    )


def split_evenly(count: int, w: World, what: str) -> range:
    """Items ``[r·count/W, (r+1)·count/W)`` of ``count`` for rank ``r`` (:class:`DistError` unless
    ``count`` is a multiple of the world size)."""
    if count % w.size:
        raise DistError(f"{count} {what} do not split evenly over {w.size} processes")
    per = count // w.size
    return range(w.rank * per, (w.rank + 1) * per)
