"""Freed memory goes back to the OS: what episode threads freed stays in glibc's per-thread arenas
until :func:`release_free_memory` returns it."""

from __future__ import annotations

import sys
import threading

import pytest

from dsv32.engine.memory import release_free_memory


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_memory_a_thread_freed_is_returned_to_the_os():
    pinned = []

    def work():  # 3000 × 64 KiB from this thread's arena, all freed but the last (it pins the heap top)
        bufs = [bytearray(64 * 1024) for _ in range(3000)]
        for b in bufs:
            b[::4096] = b"\1" * len(b[::4096])  # touch every page
        pinned.append(bufs[-1])
        del bufs[:]

    if not release_free_memory():  # the arenas start without free pages
        pytest.skip("this C library has no malloc_trim")
    before = _rss()
    t = threading.Thread(target=work)
    t.start()
    t.join()
    held = _rss() - before
    release_free_memory()
    after = _rss() - before
    assert held > 150e6  # glibc keeps the freed 190 MB in the thread's arena ...
    assert after < 30e6  # ... until it is released
