"""A persistent IPython kernel (``jupyter_client`` + ``ipykernel``) inside the sandbox.

The kernel process starts through :func:`dsv32.envs.sandbox.command_prefix` — its own namespaces,
a read-only filesystem but its work dir, no network, rlimits — and talks to this process over
ZeroMQ ``ipc`` sockets (files in the work dir: with a private network namespace, TCP on 127.0.0.1
would not reach across). One cell at a time:

- :meth:`SandboxedKernel.execute` returns what a notebook shows: stdout/stderr, the last
  expression's value (``text/plain``), and errors as ``Name: message`` with the last frames of a
  short, colour-free traceback; output past ``max_chars`` keeps its head and tail;
- a cell that runs past its timeout is interrupted (an ``interrupt_request`` on the control channel,
  so the kernel raises ``KeyboardInterrupt`` and keeps its variables); if it does not stop within a
  grace period, or the kernel died (killed by a limit, ``os._exit``), the kernel is restarted and the
  text says so — the model's variables are gone.
"""

from __future__ import annotations

import os
import queue
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass

from jupyter_client import KernelManager

from dsv32.envs import sandbox

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
INTERRUPT_GRACE_S = 5.0


class _SandboxedKernelManager(KernelManager):
    """A KernelManager whose kernel command is prefixed by the sandbox's."""

    sandbox_options: dict

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        return sandbox.command_prefix(**self.sandbox_options) + super().format_kernel_cmd(extra_arguments)


@dataclass
class CellResult:
    """One executed cell: ``text`` is what the model reads."""

    text: str
    status: str  # "ok", "error", "timeout", "died"
    seconds: float


def _shorten(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    half = max_chars // 2
    return f"{text[:half]}\n[... {len(text) - max_chars} characters cut ...]\n{text[-half:]}"


def _noise(line: str) -> bool:
    return not line.strip() or set(line.strip()) <= {"-"} or "Traceback (most recent call last)" in line


def _error_text(content: dict, frames: int = 3) -> str:
    """``Name: message`` after the last ``frames`` traceback entries, each cut to its location and
    the line that ran (``----> 4 return 1/n``), without colour codes."""
    parts = [ANSI.sub("", part) for part in content.get("traceback", [])[:-1]]
    entries = [[x for x in p.splitlines() if not _noise(x)] for p in parts]
    entries = [e for e in entries if e]
    lines = [[e[0].strip()] + [x.strip() for x in e[1:] if x.lstrip().startswith("---->")] for e in entries]
    short = ["  " + "\n    ".join(e) for e in lines[-frames:]]
    head = "Traceback (most recent call last, shortened):\n" if short else ""
    return head + "".join(s + "\n" for s in short) + f"{content['ename']}: {content['evalue']}"


class SandboxedKernel:
    """A kernel in its own sandboxed work dir (a fresh temporary one, removed by :meth:`close`)."""

    def __init__(
        self,
        *,
        workdir: str | None = None,
        memory_mb: int = 2048,
        cpu_s: float = 600,
        startup_timeout_s: float = 60,
        kind: str | None = None,
    ) -> None:
        self._own_dir = workdir is None
        self.workdir = os.path.realpath(workdir or tempfile.mkdtemp(prefix="dsv32-kernel-"))
        self.startup_timeout_s = startup_timeout_s
        env = {"IPYTHONDIR": os.path.join(self.workdir, ".ipython"), "MPLBACKEND": "Agg"}
        options = {"cwd": self.workdir, "memory_mb": memory_mb, "timeout_s": cpu_s, "cpu_s": cpu_s}
        self._sandbox_options = {**options, "env": env, "kind": kind}
        self.restarts = 0
        self._start()

    def _start(self) -> None:
        km = _SandboxedKernelManager(
            transport="ipc",
            ip=os.path.join(self.workdir, ".kernel"),
            connection_file=os.path.join(self.workdir, ".kernel.json"),
            kernel_name="python3",
        )
        km.sandbox_options = self._sandbox_options
        km.kernel_spec.interrupt_mode = "message"  # signals would stop at the sandbox's launcher
        km.start_kernel(cwd=self.workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.km, self.kc = km, km.client()
        self.kc.start_channels()
        try:
            self.kc.wait_for_ready(timeout=self.startup_timeout_s)
        except RuntimeError as err:
            self._stop()
            raise sandbox.SandboxError(f"the sandboxed Jupyter kernel did not start: {err}") from err

    def _stop(self) -> None:
        self.kc.stop_channels()
        if self.km.has_kernel:
            self.km.shutdown_kernel(now=True)
        self.km.cleanup_resources()

    def restart(self) -> None:
        """A fresh kernel in the same work dir (files kept, variables lost)."""
        self._stop()
        self.restarts += 1
        self._start()

    def alive(self) -> bool:
        return self.km.is_alive()

    def execute(self, code: str, *, timeout_s: float = 30, max_chars: int = 8000) -> CellResult:
        """Run one cell and return what it printed, its value and its error (see the module doc)."""
        start = time.perf_counter()
        msg_id = self.kc.execute(code, store_history=True, allow_stdin=False)
        parts: list[str] = []
        status, failed = self._collect(msg_id, time.monotonic() + timeout_s, parts)
        if status == "timeout":
            self.km.interrupt_kernel()
            if self._collect(msg_id, time.monotonic() + INTERRUPT_GRACE_S, [])[0] != "idle":
                status = "died"
                parts.append(f"[the cell ran past {timeout_s:g} s and did not stop when interrupted]")
            else:
                parts.append(
                    f"[interrupted: the cell ran past its {timeout_s:g} s limit; variables are kept]"
                )
        if status == "died":
            parts.append(
                "[the Python kernel died (a limit or an exit); it was restarted: variables are lost]"
            )
            self.restart()
        text = _shorten("".join(parts).rstrip("\n"), max_chars) or "[no output]"
        final = ("error" if failed else "ok") if status == "idle" else status
        return CellResult(text, final, time.perf_counter() - start)

    def _collect(self, msg_id: str, deadline: float, parts: list[str]) -> tuple[str, bool]:
        """Read this cell's iopub messages into ``parts`` until it is idle ("idle"), the deadline
        passes ("timeout") or the kernel dies ("died"); also whether it raised."""
        failed = False
        while True:
            if time.monotonic() > deadline:
                return "timeout", failed
            try:
                msg = self.kc.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                if not self.km.is_alive():
                    return "died", failed
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                parts.append(content["text"])
            elif kind in ("execute_result", "display_data") and "text/plain" in content.get("data", {}):
                parts.append(content["data"]["text/plain"] + "\n")
            elif kind == "error":
                failed = True
                parts.append(_error_text(content) + "\n")
            elif kind == "status" and content["execution_state"] == "idle":
                return "idle", failed

    def close(self) -> None:
        self._stop()
        if self._own_dir:
            sandbox.remove_tree(self.workdir)

    def __enter__(self) -> SandboxedKernel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
