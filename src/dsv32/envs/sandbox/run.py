"""Running a confined program to its end: :func:`run` starts it (``launch.popen``), feeds its
input, reads its output within a cap, keeps its files within a disk quota (``watch.DiskWatch``),
enforces the wall-time limit and returns a :class:`SandboxResult`; :func:`remove_tree` removes
whatever a program left in a directory."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from dsv32.envs.sandbox.disk import DISK_MB, disk_usage, over_quota
from dsv32.envs.sandbox.isolation import isolation
from dsv32.envs.sandbox.launch import SandboxError, kill, popen
from dsv32.envs.sandbox.leftovers import owned_tempdir, remove_tree
from dsv32.envs.sandbox.watch import DiskWatch


@dataclass
class SandboxResult:
    """What a sandboxed run did. ``returncode`` is negative for a signal; ``killed_reason`` says why
    the sandbox killed it (``"wall-time limit"``, ``"output limit"``, ``"disk limit"``: its files
    passed ``disk_mb``, or it left them past it, or they were past it before it ran, and it was not
    run: return code 126) or which limit the kernel enforced (``"cpu-time limit"``,
    ``"file-size limit"``), else None."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    killed_reason: str | None
    isolation: str
    wall_s: float
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


_SIGNALS = {signal.SIGXCPU: "cpu-time limit", signal.SIGXFSZ: "file-size limit"}


def run(
    argv: Sequence[str],
    *,
    cwd: str | os.PathLike | None = None,
    stdin: str | bytes | None = None,
    timeout_s: float,
    memory_mb: int,
    network: bool = False,
    env: dict[str, str] | None = None,
    output_bytes: int = 1 << 20,
    drain_output: bool = False,
    disk_mb: int = DISK_MB,
    **limits,
) -> SandboxResult:
    """Run ``argv`` confined and wait for it: ``cwd`` is its work dir (a fresh temporary one,
    removed afterwards, when None); ``stdin`` its input; ``output_bytes`` the most kept of each of
    stdout and stderr: past it the program is killed ("output limit"), or with ``drain_output`` it
    runs on and the rest is read and discarded (``truncated`` says so); ``disk_mb`` the most its
    files in the work dir and ``writable`` may hold (:class:`DiskWatch`); other keywords as
    :func:`command_prefix`.
    Never raises for what the program does — a crash, a limit or a timeout is in the result."""
    if not argv:
        raise SandboxError("sandbox.run needs a program to run (argv is empty)")
    if disk_mb <= 0:
        raise SandboxError("sandbox limits must be positive (disk_mb)")
    tmp = owned_tempdir("sandbox") if cwd is None else None
    workdir = tmp or str(cwd)
    kind = isolation(limits.pop("kind", None)).kind
    watched, quota = [workdir, *limits.get("writable", ())], disk_mb << 20
    if disk_usage(watched, limit=quota) > quota:
        if tmp is not None:
            remove_tree(tmp)
        return SandboxResult(
            126, "", f"sandbox: {over_quota(disk_mb)}; the program was not run\n", False, "disk limit",
            kind, 0.0,
        )  # fmt: skip
    status_r, status_w = os.pipe()
    try:
        start = time.perf_counter()
        try:
            proc = popen(
                argv, cwd=workdir, timeout_s=timeout_s, memory_mb=memory_mb, network=network, env=env,
                kind=kind, status_fd=status_w, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, **limits,
            )  # fmt: skip
        finally:
            os.close(status_w)
        reason: list[str] = []

        def overflow() -> None:
            if not drain_output:
                reason.append("output limit")
                kill(proc)

        def past_quota() -> None:
            reason.append("disk limit")
            kill(proc)

        readers = [_Reader(proc.stdout, output_bytes, overflow), _Reader(proc.stderr, output_bytes, overflow)]
        watch = DiskWatch(watched, quota, proc.pid, past_quota)
        for thread in [*readers, watch]:
            thread.start()
        _feed(proc, stdin)
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            reason.append("wall-time limit")
            kill(proc)
            proc.wait()
        kill(proc)  # whatever the program left running in its group
        watch.stop()
        for thread in [*readers, watch]:
            thread.join(timeout=5)
        wall = time.perf_counter() - start
        code = _program_status(status_r, proc.returncode)
        if not reason and code is not None and -code in _SIGNALS:
            reason.append(_SIGNALS[signal.Signals(-code)])
        if not reason and disk_usage(watched, limit=quota) > quota:  # past it in its last moments
            reason.append("disk limit")
        return SandboxResult(
            code, readers[0].text(), readers[1].text(), timed_out, reason[0] if reason else None, kind, wall,
            any(r.overflowed for r in readers),
        )  # fmt: skip
    finally:
        os.close(status_r)
        if tmp is not None:
            remove_tree(tmp)


def _program_status(fd: int, fallback: int) -> int:
    """The program's own end as the confine stage reported it (``-N`` for signal N), else the
    launcher's return code (the confine stage itself was killed or failed, or the report is not
    one the confine stage writes)."""
    os.set_blocking(fd, False)
    try:
        report = os.read(fd, 64).decode("ascii")
    except (BlockingIOError, UnicodeDecodeError):
        return fallback
    kind, _, value = report.partition(" ")
    if kind not in ("exit", "signal") or not value.isdigit() or int(value) > 255:
        return fallback
    return -int(value) if kind == "signal" else int(value)


def _feed(proc: subprocess.Popen, stdin: str | bytes | None) -> None:
    data = stdin.encode() if isinstance(stdin, str) else stdin

    def write() -> None:
        try:
            if data:
                proc.stdin.write(data)
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass  # the program exited or closed its input: what it did is in its result

    threading.Thread(target=write, daemon=True).start()


class _Reader(threading.Thread):
    """Reads one pipe to its end, keeping the first ``cap`` bytes; past the cap it calls
    ``on_overflow`` once and discards (drains) the rest."""

    def __init__(self, pipe, cap: int, on_overflow) -> None:
        super().__init__(daemon=True)
        self.pipe, self.cap, self.on_overflow = pipe, cap, on_overflow
        self.chunks: list[bytes] = []
        self.size = 0
        self.overflowed = False

    def run(self) -> None:
        while chunk := self.pipe.read1(65536):
            if self.size < self.cap:
                self.chunks.append(chunk[: self.cap - self.size])
            self.size += len(chunk)
            if self.size > self.cap and not self.overflowed:
                self.overflowed = True
                self.on_overflow()

    def text(self) -> str:
        out = b"".join(self.chunks).decode("utf-8", errors="replace")
        return out + (f"\n[output truncated: {self.size} bytes, kept {self.cap}]" if self.overflowed else "")
