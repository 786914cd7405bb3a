"""The harness's side of :mod:`dsv32.eval.bfcl.worker`: start it in the sandbox, send it calls.

BFCL's multi-turn categories execute the package's API classes (an in-memory file system, a
trading bot, ...) with the arguments the model chose. Those classes are trusted code, but the
arguments are not (``MathAPI.power`` with a huge exponent, a file system filled without bound), so the
classes run in a sandboxed worker process (:func:`dsv32.envs.sandbox.popen`: no network, read-only
host filesystem, memory, CPU and process limits) and every call has a wall-time limit. A call that
passes it kills the worker; the episode fails with that reason.

Ground-truth calls are BFCL's strings (``"cd(folder='document')"``, ``"sort('final_report.pdf')"``):
:func:`parse_call` reads them with :mod:`ast` (literal arguments only, nothing is evaluated) and
binds positional arguments to parameter names with the API method's signature.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import json
import queue
import subprocess
import sys
import tempfile
import threading
from functools import cache
from pathlib import Path

from dsv32.envs import sandbox
from dsv32.eval.bfcl.worker import MODULES, PREFIX
from dsv32.eval.errors import EvalError

WORKER = str(Path(__file__).with_name("worker.py"))
CALL_TIMEOUT_S = 20.0
MEMORY_MB = 2048
LIFETIME_CPU_S = 600


class WorkerError(EvalError):
    """The API worker died, timed out or answered something that is not the protocol."""


@cache
def _signatures(class_name: str) -> dict[str, inspect.Signature]:
    cls = getattr(importlib.import_module(f"{PREFIX}.{MODULES[class_name]}"), class_name)
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls, predicate=inspect.isfunction)
        if not name.startswith("_")
    }


def parse_call(text: str, classes: list[str]) -> tuple[str, dict]:
    """``(name, keyword arguments)`` of a ground-truth call string (literals only)."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as err:
        raise EvalError(f"ground-truth call {text!r} is not a Python call: {err.msg}") from err
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise EvalError(f"ground-truth call {text!r} is not a plain function call")
    name = node.func.id
    args = [ast.literal_eval(a) for a in node.args]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
    if args:
        signature = next((_signatures(c)[name] for c in reversed(classes) if name in _signatures(c)), None)
        if signature is None:
            raise EvalError(f"ground-truth call {text!r}: no class of {classes} defines {name!r}")
        bound = signature.bind(None, *args, **kwargs)  # None stands for self
        kwargs = {k: v for k, v in bound.arguments.items() if k != "self"}
    return name, kwargs


class ApiWorker:
    """One sandboxed worker holding the ``model`` and ``truth`` worlds of one BFCL entry."""

    def __init__(
        self, classes: list[str], config: dict, long_context: bool, timeout_s: float = CALL_TIMEOUT_S
    ):
        unknown = [c for c in classes if c not in MODULES]
        if unknown:
            raise EvalError(f"BFCL class(es) {unknown} are not supported (known: {', '.join(MODULES)})")
        self.timeout_s = timeout_s
        self.tmp = tempfile.TemporaryDirectory(prefix="dsv32-bfcl-")
        self.proc = sandbox.popen(
            [sys.executable, "-I", WORKER],
            cwd=self.tmp.name,
            readable=[WORKER],  # the one file of this project it runs (the rest of it is hidden)
            timeout_s=timeout_s,
            cpu_s=LIFETIME_CPU_S,
            memory_mb=MEMORY_MB,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        setup = {"classes": classes, "config": config, "long_context": long_context}
        self.methods = set(self._ask(setup, timeout_s=max(60.0, timeout_s))["methods"])

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(b"")

    def _ask(self, request: dict, timeout_s: float | None = None) -> dict:
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as err:
            raise WorkerError(f"the BFCL API worker is gone ({err})") from err
        try:
            line = self.lines.get(timeout=timeout_s or self.timeout_s)
        except queue.Empty:
            self.close()
            raise WorkerError(f"a BFCL API call took longer than {timeout_s or self.timeout_s:g} s") from None
        if not line:
            raise WorkerError(f"the BFCL API worker exited (status {self.proc.poll()})")
        return json.loads(line)

    def call(self, world: str, name: str, kwargs: dict) -> str:
        return self._ask({"op": "call", "world": world, "name": name, "args": [], "kwargs": kwargs})["result"]

    def differences(self) -> dict:
        return self._ask({"op": "compare"})["differences"]

    def close(self) -> None:
        sandbox.kill(self.proc)
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        self.tmp.cleanup()

    def __enter__(self) -> ApiWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
