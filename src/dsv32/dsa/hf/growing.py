"""A tensor that grows along one dimension inside a preallocated buffer.

A decode step appends one token to every cache tensor. ``torch.cat`` copies all that is held each
time: O(S) bytes per step, O(S²) per sequence, which at a few thousand tokens costs as much as the
model's linears on a CPU. :class:`GrowingTensor` writes only the new slice into a buffer with
headroom and reallocates geometrically, so a token costs O(1) copies amortised; what it hands out is
a view of the buffer's first ``length`` entries, read like the concatenation it replaces.

The holder (a cache layer, the DSA indexer-key store) keeps the view as it kept the concatenation
and passes it back on the next append; the view is what keeps the buffer alive. Whoever replaces
the held tensor (batch merging, row selection, moving devices) needs to know nothing of the buffer:
the old one is freed with its last view, and a held tensor that is not the view handed out last is
copied into a fresh buffer on the next append, so no outside write can reach the buffer. The one place a view is reused shorter is :meth:`cut` (a cache cut back to a prefix): a
tensor handed out earlier beyond the cut may then see the new entries written after it.

Writing in place is for forwards without autograd (the engine decodes under ``torch.no_grad``): a
view that autograd saved for the backward must not change, so the holders concatenate instead
whenever gradients are enabled.
"""

from __future__ import annotations

import weakref

import torch


class GrowingTensor:
    """Appends along ``dim`` into a buffer with ``headroom`` (a fraction of the length, at least
    ``min_headroom`` entries) left after every reallocation.

    It keeps only a weak reference to the view it handed out last: the holder's view is what keeps
    the buffer alive (``view._base``), so a holder that replaces or drops its tensor frees the
    buffer at once, whoever did the replacing."""

    __slots__ = ("_view", "dim", "headroom", "min_headroom")

    def __init__(self, dim: int, *, headroom: float = 0.25, min_headroom: int = 256) -> None:
        if dim < 0:
            raise ValueError(f"dim must be non-negative (the held tensors' rank is not known yet), got {dim}")
        if headroom < 0 or min_headroom < 1:
            raise ValueError(f"headroom must be >= 0 and min_headroom >= 1, got {headroom}, {min_headroom}")
        self.dim, self.headroom, self.min_headroom = dim, headroom, min_headroom
        self._view: weakref.ref | None = None

    @property
    def view(self) -> torch.Tensor | None:
        """The view handed out last (or cut from it), while its holder keeps it."""
        return None if self._view is None else self._view()

    @property
    def buffer(self) -> torch.Tensor | None:
        """The buffer behind :attr:`view` (None once the view is gone)."""
        view = self.view
        return None if view is None else view._base

    def extend(self, held: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
        """``held`` followed by ``new`` along ``dim`` (what ``torch.cat((held, new), dim)`` holds).

        ``held`` is extended in place when it is the view this object handed out last and ``new``
        matches the buffer (its other dims, dtype and device; no inference tensor outside inference
        mode); anything else — None, an empty tensor, any other tensor — starts a fresh buffer from a
        copy of it, in the dtype ``torch.cat`` would give.
        """
        d = self.dim
        buffer = self.buffer if held is not None and held is self.view else None
        if buffer is not None and _fits(buffer, new, d):
            n, source, dtype = held.shape[d], buffer, buffer.dtype
        else:
            buffer = None
            n = 0 if held is None or held.numel() == 0 else held.shape[d]
            if n and (held.shape[:d] != new.shape[:d] or held.shape[d + 1 :] != new.shape[d + 1 :]):
                raise ValueError(
                    f"cannot append a tensor of shape {tuple(new.shape)} to one of shape {tuple(held.shape)} "
                    f"along dim {d}: the other dimensions differ"
                )
            source, dtype = held, torch.promote_types(held.dtype, new.dtype) if n else new.dtype
        m = new.shape[d]
        if buffer is None or n + m > buffer.shape[d]:
            shape = list(new.shape)
            shape[d] = n + m + max(int((n + m) * self.headroom), self.min_headroom)
            fresh = new.new_empty(shape, dtype=dtype)
            if n:
                fresh.narrow(d, 0, n).copy_(source.narrow(d, 0, n))
            buffer = fresh
        buffer.narrow(d, n, m).copy_(new)
        view = buffer.narrow(d, 0, n + m)
        self._view = weakref.ref(view)
        return view

    def cut(self, held: torch.Tensor, keep: int) -> torch.Tensor:
        """The first ``keep`` entries of ``held``; later appends reuse the buffer when ``held`` is its view."""
        keep = max(0, min(keep, held.shape[self.dim]))
        out = held.narrow(self.dim, 0, keep)
        if held is self.view:
            self._view = weakref.ref(out)
        return out


def _fits(buffer: torch.Tensor, new: torch.Tensor, d: int) -> bool:
    """``new`` can be written into ``buffer`` as it is (a cut to zero keeps the view, so the held
    tensor's own shape says nothing)."""
    return (
        buffer.shape[:d] == new.shape[:d]
        and buffer.shape[d + 1 :] == new.shape[d + 1 :]
        and buffer.dtype == new.dtype
        and buffer.device == new.device
        and (torch.is_inference_mode_enabled() or not buffer.is_inference())
    )
