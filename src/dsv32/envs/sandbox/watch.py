"""The disk watch: one thread of this process keeps every running sandbox within its disk quota
(:class:`DiskWatch`, measured with ``disk.disk_usage``)."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Sequence

from dsv32.envs.sandbox.disk import disk_usage

log = logging.getLogger(__name__)

DISK_POLL_S = 0.02  # how often the watch reads the free space of the watched filesystems
DISK_PERIOD_S = (0.5, 2.0)  # the shortest and longest time between two regular walks of the tree
DISK_WALK_SHARE = 0.05  # the share of a core the regular walks of all watches may take (then: longer periods)


class DiskWatch:
    """Keeps a running sandbox within its disk quota: measures :func:`disk_usage` of ``paths`` and
    of the processes under ``pid`` and, once the total passes ``quota`` bytes, sets :attr:`over`,
    calls ``on_over`` (which kills the program) and ends; :meth:`stop` ends it too. :meth:`start`
    hands it to this process's one watcher thread (:class:`_Watcher`), which serves every watch:
    a hundred kernels cost one thread's polls, not a hundred.

    Every ``DISK_POLL_S`` (20 ms) the watcher reads the free space of the watched filesystems (one
    ``statvfs`` per filesystem for all watches) and walks a watch's tree at once when that fell by
    more than what is left of its quota since its last walk (such walks take at most a fifth of a
    core); and it walks each tree anyway every ``DISK_PERIOD_S[0]`` (0.5 s), less often when the
    regular walks of all watches would take more than ``DISK_WALK_SHARE`` (5 %) of a core at that
    pace, at least every ``DISK_PERIOD_S[1]`` (2 s). A program thus passes the quota by about what
    it writes in one poll and one walk; by what it writes in one period where other programs free
    as much space on the same filesystem meanwhile, where the filesystem's free space lags (a
    network filesystem), or where it fills memory-backed files (memfd) instead."""

    def __init__(self, paths: Sequence[str | os.PathLike], quota: int, pid: int, on_over: Callable[[], None]):
        self.paths = [os.path.realpath(p) for p in paths]
        self.quota, self.pid, self.on_over = quota, pid, on_over
        self.used = 0  # at the last walk
        self.over = False
        self._stopped = threading.Event()
        self._done = threading.Event()  # the watcher let it go (stopped, or past the quota)
        self._filesystems = {}  # one watched path on each filesystem
        for path in self.paths:
            with contextlib.suppress(OSError):
                self._filesystems.setdefault(os.stat(path).st_dev, path)
        self._walked, self._period, self._gap, self._free_then = -math.inf, 0.0, 0.0, 0

    def start(self) -> None:
        _WATCHER.add(self)

    def stop(self) -> None:
        self._stopped.set()

    def join(self, timeout: float | None = None) -> None:
        """Wait until the watcher has let this watch go (a walk in progress finishes first)."""
        self._done.wait(timeout)

    def is_alive(self) -> bool:
        return not self._done.is_set()

    def _poll(self, free_of: Callable[[int, str], int], watches: int) -> bool:
        """One poll (on the watcher's thread); False once the watch is over."""
        if self._stopped.is_set():
            return False
        free = sum(free_of(dev, path) for dev, path in self._filesystems.items())
        since = time.monotonic() - self._walked
        fell = self._free_then - free > self.quota - self.used
        if since < self._period and not (fell and since >= self._gap):
            return True
        cpu = time.thread_time()
        self.used = disk_usage(self.paths, pids=[self.pid], limit=self.quota)
        cost = time.thread_time() - cpu
        self._walked, self._free_then = time.monotonic(), free
        if self.used > self.quota:
            self.over = True
            if not self._stopped.is_set():  # (stopped: the program has ended)
                self.on_over()
            return False
        self._period = min(max(DISK_PERIOD_S[0], cost * watches / DISK_WALK_SHARE), DISK_PERIOD_S[1])
        self._gap = 4 * cost
        return True


class _FreeSpace(dict):
    """The free bytes of each filesystem (by device), read once: ``free(dev, a path on it)``."""

    def __call__(self, dev: int, path: str) -> int:
        if dev not in self:
            self[dev] = 0
            with contextlib.suppress(OSError):
                fs = os.statvfs(path)
                self[dev] = fs.f_bfree * fs.f_frsize
        return self[dev]


class _Watcher:
    """The thread that polls every :class:`DiskWatch` of this process (started with the first)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: list[DiskWatch] = []
        self._any = threading.Event()  # set while there are watches: no polls while none runs
        self._thread: threading.Thread | None = None

    def add(self, watch: DiskWatch) -> None:
        with self._lock:
            self._watches.append(watch)
            self._any.set()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, daemon=True, name="dsv32-disk-watch")
                self._thread.start()

    def _run(self) -> None:
        while True:
            self._any.wait()
            time.sleep(DISK_POLL_S)
            with self._lock:
                watches = list(self._watches)
            free_of = _FreeSpace()  # this poll's: one statvfs per filesystem
            for watch in watches:
                try:
                    alive = watch._poll(free_of, len(watches))
                except Exception:  # a walk that failed: its program is stopped, never left unwatched
                    log.exception("sandbox: a disk watch failed; the program is stopped")
                    alive = False
                    with contextlib.suppress(Exception):
                        watch.on_over()
                if not alive:
                    with self._lock:
                        self._watches.remove(watch)
                        if not self._watches:
                            self._any.clear()
                    watch._done.set()


_WATCHER = _Watcher()
