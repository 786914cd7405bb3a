"""Deterministic standard-library calls for "what does ``f(args)`` return?" questions.

Each entry names a documented function and draws arguments from a seeded ``random.Random``; the
answer is what the call returns when the generator runs it here (``repr`` of the result), so it is
exact for this Python. Only pure functions whose result follows from their documentation are
listed (no hashes, no locale, no clock).
"""

from __future__ import annotations

import bisect
import calendar
import fnmatch
import heapq
import html
import keyword
import math
import posixpath
import random
import shlex
import statistics
import string
import textwrap
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

_WORDS = ["alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "maple", "orbit", "pixel", "quartz"]


@dataclass(frozen=True)
class Call:
    """``doc_id`` documents ``fn``; ``draw(rng)`` returns its positional arguments; ``shown`` is the
    name the question calls it by (default ``doc_id``)."""

    doc_id: str
    fn: Callable
    draw: Callable[[random.Random], tuple]
    shown: str = ""

    @property
    def name(self) -> str:
        return self.shown or self.doc_id


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def _path(rng: random.Random) -> str:
    parts = [rng.choice(_WORDS) for _ in range(rng.randint(1, 3))]
    return "/".join(parts) + rng.choice([".tar.gz", ".py", ".txt", ""])


def _sorted_ints(rng: random.Random) -> list[int]:
    return sorted(rng.sample(range(1, 60), rng.randint(4, 8)))


CALLS: tuple[Call, ...] = (
    Call("calendar.monthrange", calendar.monthrange, lambda r: (r.randint(1990, 2030), r.randint(1, 12))),
    Call("calendar.isleap", calendar.isleap, lambda r: (r.choice([1900, 2000, 2024, 2023, 2100, r.randint(1800, 2400)]),)),
    Call("calendar.weekday", calendar.weekday, lambda r: (r.randint(1990, 2030), r.randint(1, 12), r.randint(1, 28))),
    Call("calendar.leapdays", calendar.leapdays, lambda r: (a := r.randint(1890, 2000), a + r.randint(5, 150))),
    Call("math.comb", math.comb, lambda r: (n := r.randint(5, 30), r.randint(0, n))),
    Call("math.isqrt", math.isqrt, lambda r: (r.randint(10, 100000),)),
    Call("math.gcd", math.gcd, lambda r: (r.randint(2, 500) * 6, r.randint(2, 500) * 4)),
    Call("textwrap.shorten", textwrap.shorten, lambda r: (_sentence(r, 6), r.randint(12, 30))),
    Call("string.capwords", string.capwords, lambda r: (_sentence(r, 3).replace(" ", "  ", 1),)),
    Call("html.escape", html.escape, lambda r: (f"<{r.choice(_WORDS)} a=\"{r.choice(_WORDS)}\"> & '{r.choice(_WORDS)}'",)),
    Call("urllib.parse.quote", urllib.parse.quote, lambda r: (f"/{r.choice(_WORDS)} {r.choice(_WORDS)}/a&b=c~d",)),
    Call("posixpath.splitext", posixpath.splitext, lambda r: (_path(r),)),
    Call("posixpath.basename", posixpath.basename, lambda r: (_path(r) + r.choice(["", "/"]),)),
    Call("posixpath.normpath", posixpath.normpath, lambda r: (f"/{r.choice(_WORDS)}/../{r.choice(_WORDS)}/./x//y",)),
    Call("genericpath.commonprefix", posixpath.commonprefix, lambda r: ([f"/usr/{r.choice(_WORDS)}", f"/usr/{r.choice(_WORDS)}"],), "os.path.commonprefix"),
    Call("fnmatch.fnmatch", fnmatch.fnmatch, lambda r: (_path(r), r.choice(["*.py", "*.t?t", "[a-m]*", "*a*"]))),
    Call("shlex.split", shlex.split, lambda r: (f"{r.choice(_WORDS)} '{_sentence(r, 2)}' --x=\"{r.choice(_WORDS)} 1\"",)),
    Call("statistics.median_low", statistics.median_low, lambda r: (r.sample(range(1, 100), 2 * r.randint(2, 4)),)),
    Call("bisect.bisect_left", bisect.bisect_left, lambda r: (a := _sorted_ints(r), r.choice(a))),
    Call("bisect.bisect", bisect.bisect_right, lambda r: (a := _sorted_ints(r), r.choice(a)), "bisect.bisect_right"),
    Call("heapq.nsmallest", heapq.nsmallest, lambda r: (r.randint(2, 4), r.sample(range(100), 7))),
    Call("keyword.iskeyword", keyword.iskeyword, lambda r: (r.choice(["match", "async", "print", "None", "nonlocal", "self"]),)),
)  # fmt: skip


def render(name: str, args: tuple) -> str:
    """The call as Python source: ``calendar.monthrange(2023, 2)``."""
    return f"{name}({', '.join(repr(a) for a in args)})"
