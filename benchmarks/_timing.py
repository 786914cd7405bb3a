"""Timing shared by the benchmark scripts: interleaved repetitions, medians and spread, and how much
of the machine other processes used meanwhile.

On a shared machine one busy core stalls each parallel op of a torch call that uses every core, so a
single timing can be several times too slow, and two sides timed one after the other can see
different loads. Every comparison here therefore runs its sides interleaved (A B A B ..., after one
warm-up call of each), reports the median of each side with its spread, and records the load:

- ``others``: the share of the machine's CPU time (``/proc/stat``, all cores) that other processes
  used during a measurement — the machine's busy time minus this process's own CPU time. The kernel
  counts in ticks (10 ms), so a window shorter than ``Meter.min_window`` (0.1 s) reads as ``None``
  rather than a meaningless 0; each repetition block (one call of every side) and all the blocks
  together are measured as a whole too, which are the numbers to look at for short calls.
- ``Meter.wait_quiet`` waits for a quiet machine before the first block and after a contended one,
  but the run as a whole waits at most ``max_wait`` seconds (``--max-wait``; ``0``: never wait): on
  a machine that never gets quiet the run still ends, and the contention is in the JSON beside each
  number instead.

This module is imported by the scripts beside it (its name starts with ``_``, so ``run_all.py`` does
not run it).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path


def add_max_wait(ap) -> None:
    """The ``--max-wait`` option of a script timed with :class:`Meter` (see :func:`wait_budget`)."""
    ap.add_argument(
        "--max-wait",
        type=float,
        default=None,
        help="seconds this whole run may wait for a quiet CPU before its repetition blocks (default 60, "
        "--quick 10; 0: never wait)",
    )


def wait_budget(args) -> float:
    """The run's waiting budget: ``--max-wait``, else 10 s with ``--quick`` and 60 s without."""
    return args.max_wait if args.max_wait is not None else (10.0 if args.quick else 60.0)


class Meter:
    """Wall-clock timing that knows when other processes competed for the CPU (see the module)."""

    def __init__(
        self, threshold: float = 0.1, max_wait: float = 60.0, retries: int = 0, min_window: float = 0.1
    ) -> None:
        self.threshold, self.max_wait = threshold, max_wait
        self.retries, self.min_window = retries, min_window
        self.cpus = os.cpu_count() or 1
        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.available = self._busy() is not None
        # seconds this run spent waiting for a quiet machine: max_wait, plus one 0.3 s probe at most
        self.waited = 0.0
        self.retried = 0  # contended measurements run again

    def _busy(self) -> float | None:
        """CPU-seconds the whole machine has been busy (None where /proc/stat is missing)."""
        try:
            fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        except OSError:
            return None
        ticks = [int(f) for f in fields]
        return (sum(ticks) - ticks[3] - ticks[4]) / self.hz  # all but idle and iowait

    @staticmethod
    def _own() -> float:
        t = os.times()
        return t.user + t.system

    def _mark(self) -> tuple[float, float, float]:
        busy = self._busy() if self.available else 0.0
        return busy or 0.0, self._own(), time.perf_counter()

    def _others(self, mark: tuple[float, float, float]) -> float | None:
        """Others' share of the machine since ``mark``; None without /proc/stat or under ``min_window``."""
        busy0, own0, t0 = mark
        wall = time.perf_counter() - t0
        if not self.available or wall < self.min_window:
            return None
        foreign = (self._busy() - busy0) - (self._own() - own0)
        return round(max(0.0, foreign / (wall * self.cpus)), 3)

    @property
    def wait_left(self) -> float:
        return max(0.0, self.max_wait - self.waited)

    def wait_quiet(self) -> None:
        """Wait until others use less than half of ``threshold`` of the machine, or the run's waiting
        budget is spent."""
        if not self.available:
            return
        budget, start = self.wait_left, time.monotonic()
        try:
            while time.monotonic() - start < budget:
                mark = self._mark()
                time.sleep(0.3)
                others = self._others(mark)
                if others is not None and others < self.threshold / 2:
                    return
                time.sleep(max(0.0, min(1.0, budget - (time.monotonic() - start))))
        finally:
            self.waited += time.monotonic() - start

    def run(self, fn: Callable[[], object], calls: int = 1) -> tuple[float, float | None]:
        """Seconds per call (mean of ``calls``) and the others' share of the machine meanwhile. A
        contended measurement is taken again up to ``retries`` times while the waiting budget lasts
        (the discarded one's time is charged to it)."""
        for attempt in range(self.retries + 1):
            mark = self._mark()
            for _ in range(calls):
                fn()
            wall = time.perf_counter() - mark[2]
            others = self._others(mark)
            contended = others is not None and others >= self.threshold
            if not contended or attempt == self.retries or self.wait_left <= 0:
                return wall / calls, others
            self.retried += 1
            self.waited += wall
            self.wait_quiet()
        raise AssertionError("unreachable")

    @contextmanager
    def window(self) -> Iterator[dict]:
        """``with meter.window() as w:`` … then ``w["others"]``: others' share over the whole block."""
        box: dict = {"others": None}
        mark = self._mark()
        try:
            yield box
        finally:
            box["others"] = self._others(mark)

    def facts(self) -> dict:
        """How this run was measured, for the JSON."""
        return {
            "cpus": self.cpus,
            "load_average_1min": round(os.getloadavg()[0], 2),
            "contention_threshold": self.threshold,
            "max_wait_s": self.max_wait,
            "waited_s": round(self.waited, 1),
            "retried": self.retried,
        }


def spread(values: list[float]) -> dict:
    """Median, min and max of repeated measurements (an empty list: all None)."""
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


@dataclass
class Interleaved:
    """What :func:`interleaved` measured: per side, each repetition's seconds, the value its call
    returned and others' share of the machine during it; per block, others' share over the block."""

    seconds: dict[Hashable, list[float]] = field(default_factory=dict)
    values: dict[Hashable, list[object]] = field(default_factory=dict)
    others: dict[Hashable, list[float | None]] = field(default_factory=dict)
    blocks: list[float | None] = field(default_factory=list)
    overall: float | None = None  # over all the blocks together

    def median(self, name: Hashable) -> float:
        return statistics.median(self.seconds[name])

    def contention(self) -> dict:
        """Others' share of the machine over all the blocks, per block, and the blocks' median and max
        (None where a window was too short to measure)."""
        known = [b for b in self.blocks if b is not None]
        return {
            "overall": self.overall,
            "blocks": self.blocks,
            "median_block": statistics.median(known) if known else None,
            "max_block": max(known) if known else None,
        }


def interleaved(
    fns: dict[Hashable, Callable[[], object]],
    reps: int,
    meter: Meter,
    *,
    calls: int | dict[Hashable, int] = 1,
    warmup: bool = True,
    log: Callable[[int, Hashable, float, float | None], None] | None = None,
) -> Interleaved:
    """One warm-up call of each side (``warmup``), then ``reps`` blocks, each calling every side in
    order (A B C A B C ...). Each call of a side is timed (``calls`` calls averaged: a number, or one
    per side) with others' share of the machine during it, during its block and over all the blocks.
    The first block, and one after a contended block, waits for a quiet machine first (within the
    run's budget). ``log(rep, name, seconds, others)`` is called after each measurement."""
    out = Interleaved({n: [] for n in fns}, {n: [] for n in fns}, {n: [] for n in fns})
    if warmup:
        for fn in fns.values():
            fn()
    with meter.window() as whole:
        for rep in range(reps):
            previous = out.blocks[-1] if out.blocks else None
            if rep == 0 or (previous is not None and previous >= meter.threshold):
                meter.wait_quiet()
            with meter.window() as block:
                for name, fn in fns.items():
                    box: list[object] = []
                    n = calls if isinstance(calls, int) else calls[name]
                    seconds, others = meter.run(lambda fn=fn, box=box: box.append(fn()), n)
                    out.seconds[name].append(seconds)
                    out.values[name].append(box[-1])
                    out.others[name].append(others)
                    if log is not None:
                        log(rep, name, seconds, others)
            out.blocks.append(block["others"])
    out.overall = whole["others"]
    return out
