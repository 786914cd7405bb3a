"""A pytest plugin that records which functions of a repository the tests call (for the miner,
which injects bugs only into called functions).

Standard library only: :func:`~dsv32.envs.swe.testrun.run_pytest` copies this file into the run's
scratch directory and loads it with ``-p _dsv32_calltrace`` (the sandbox hides this project's source); ``DSV32_TRACE_ROOT`` names the repository and
``DSV32_TRACE_OUT`` the JSON file written at the end: ``[[relative path, first line], ...]`` of every
Python function entered under the root (a code object's first line is its first decorator's, else
its ``def``). A ``sys.setprofile`` hook sees each call once per code object, so the suite runs at
close to its usual speed.
"""

from __future__ import annotations

import json
import os
import sys
import threading

_SEEN: set[tuple[str, int]] = set()


def _profile(frame, event, arg) -> None:
    if event == "call":
        code = frame.f_code
        _SEEN.add((code.co_filename, code.co_firstlineno))


def pytest_configure(config) -> None:
    if os.environ.get("DSV32_TRACE_OUT"):
        sys.setprofile(_profile)
        threading.setprofile(_profile)


def pytest_unconfigure(config) -> None:
    out = os.environ.get("DSV32_TRACE_OUT")
    if not out:
        return
    sys.setprofile(None)
    threading.setprofile(None)  # type: ignore[arg-type]
    root = os.path.realpath(os.environ.get("DSV32_TRACE_ROOT", os.getcwd()))
    rows = sorted(
        {
            (os.path.relpath(os.path.realpath(f), root), line)
            for f, line in _SEEN
            if os.path.realpath(f).startswith(root + os.sep)
        }
    )
    with open(out, "w", encoding="utf-8") as f:
        json.dump(rows, f)
