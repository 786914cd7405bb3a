"""A persistent IPython kernel (``jupyter_client`` + ``ipykernel``) inside the sandbox.

The kernel process starts through :func:`dsv32.envs.sandbox.command_prefix` — its own namespaces,
a read-only filesystem but its work dir, no network, rlimits — and talks to this process over
ZeroMQ ``ipc`` sockets (with a private network namespace, TCP on 127.0.0.1 would not reach across).

Nothing a cell writes runs when the kernel (re)starts: the work dir is writable, so the sockets, the
connection file and the IPython dir (profile config, startup files) live in a fresh directory for
each start, made by this process and removed when that kernel stops; the kernel's Python runs with
``-P`` and ``-s``, so neither the work dir (the current directory) nor the user site under ``HOME``
(also the work dir) is on its import path while it starts. Once it has started, ``bootstrap.py`` (a
copy in that fresh directory, run by the profile's startup file) puts the work dir on the import path
where IPython puts it (after the standard library), so cells import the modules they wrote. One cell
at a time:

- :meth:`SandboxedKernel.execute` returns what a notebook shows: stdout/stderr, the last
  expression's value (``text/plain``), and errors as ``Name: message`` with the last frames of a
  short, colour-free traceback; output past ``max_chars`` keeps its head and tail, and is kept so
  while it arrives: the kernel cuts each message's text, this process refuses messages over
  ``MAX_MESSAGE_BYTES``, so its memory stays bounded whatever a cell prints or sends;
- code that UTF-8 cannot encode (a lone surrogate) is a ``SyntaxError`` text and is not sent;
- a cell that runs past its timeout is interrupted (an ``interrupt_request`` on the control channel,
  so the kernel raises ``KeyboardInterrupt`` and keeps its variables); if it does not stop within a
  grace period, or the kernel died (killed by a limit, ``os._exit``), the kernel is restarted and the
  text says so — the model's variables are gone. A start that fails is the cell's text too, and the
  next cell starts the kernel again;
- the files in the work dir (and the kernel's run directory) are kept within ``disk_mb`` by a
  :class:`~dsv32.envs.sandbox.DiskWatch` running beside the kernel: past it the kernel is killed,
  its work dir emptied (when it is the kernel's own) and the kernel restarted, and the text says
  so — variables and files are gone. That happens between cells too (a thread a cell started); the
  next cell then says so and runs in the fresh kernel. A work dir already past the quota (one the
  caller gave) does not start a kernel.

Every interaction with the kernel — starting it, each cell, interrupts, restarts, stopping it — runs
on one long-lived thread the kernel owns (``dsv32-kernel``); callers wait for it. Two reasons: ZeroMQ
sockets must never be used by two threads at once (libzmq aborts the process, or replies reach the
wrong reader), and the sandbox kills the kernel when the *thread* that started it ends (bubblewrap's
``--die-with-parent`` is ``PR_SET_PDEATHSIG``), so a kernel started in a short-lived worker thread
(the agent's tool-timeout thread) would die after the call. Cells run one at a time: a caller that
stops waiting (a tool timeout) leaves its cell to finish within its own limit, and the next cell
waits for it — at most ``wait_s``, after which it is not run and the text says the kernel is busy.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import os
import queue
import re
import shutil
import subprocess
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import zmq
from jupyter_client import KernelManager

from dsv32.envs import sandbox
from dsv32.envs.interpreter import bootstrap

log = logging.getLogger(__name__)

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
INTERRUPT_GRACE_S = 5.0
STARTUP_TIMEOUT_S = 60.0  # how long a kernel may take to start (the queue for a start included)
STOP_S = 30.0  # how long close() waits for the kernel's thread to stop the kernel


# What reaches this process is bounded twice. The kernel cuts the text of each message (a stream, a
# value, a display) to its first and last bootstrap.KEEP characters (counting the rest) and sends no
# other formats than text, so a print loop or a huge value sends small messages; its own memory stays
# bounded too (a stream is sent every bootstrap.FLUSH characters, and IPython does not keep cells'
# output for its history). For whatever a cell sends past that, this process's sockets refuse a
# message over MAX_MESSAGE_BYTES and queue at most QUEUED_MESSAGES: host memory stays bounded
# whatever the kernel does. A cell whose messages were refused ends when its execute_reply is in and
# the kernel stays quiet for REPLY_QUIET_S.
MAX_MESSAGE_BYTES = 8 << 20
QUEUED_MESSAGES = 8
REPLY_QUIET_S = 2.0

# The kernel's IPython profile, written into each start's fresh IPython dir.
# ``ipykernel_launcher`` without the debugger: ipykernel imports debugpy when it can (a sixth of a
# kernel's start-up CPU) for a debug channel nothing here opens; marked missing, it is not imported.
KERNEL_MAIN = "import sys; sys.modules['debugpy'] = None; from ipykernel import kernelapp; kernelapp.launch_new_instance()"
KERNEL_CONFIG = "c.InteractiveShellApp.ignore_cwd = True  # the startup file adds it, once started\n"


def _startup_file(bootstrap_copy: str) -> str:
    """The profile's startup file: it runs the copy of ``bootstrap.py`` at ``bootstrap_copy`` in a
    namespace of its own (a startup file runs in the cells' namespace) and installs it."""
    return f"__import__('runpy').run_path({bootstrap_copy!r})['install'](get_ipython())\n"


# The directories of kernels not closed yet: removed when this process exits (the kernels die with it);
# a process killed outright leaves them, for the next process's sweep (``sandbox.leftovers``).
_UNREMOVED: set[str] = set()

# At most this many kernels of this process start at once (a start is ~0.35 CPU-seconds, mostly
# imports): a hundred episodes reaching their first cell together queue for a few cores instead of
# thrashing them, so each start stays short and they finish in order. A start holds its place until
# the kernel first answers on its shell channel (its imports are done), not through the client's
# IOPub check that follows, which is mostly waiting. The queue's wait is part of the start's
# ``startup_timeout_s``.
CONCURRENT_STARTS = max(2, os.cpu_count() or 2)
_STARTING = threading.BoundedSemaphore(CONCURRENT_STARTS)


# The kernels of this process that are running: stopped at exit before their directories are removed
# (a kernel still alive can write into its run dir while it is being removed).
_RUNNING: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _remove_unclosed() -> None:
    for kernel in list(_RUNNING):
        _attempt(kernel._stop)
    for path in list(_UNREMOVED):
        sandbox.remove_tree(path)


def execute_bound_s(timeout_s: float, wait_s: float, startup_timeout_s: float = STARTUP_TIMEOUT_S) -> float:
    """The longest :meth:`SandboxedKernel.execute` takes with these limits: waiting for an earlier
    cell (``wait_s``), a start, the cell (``timeout_s``), an interrupt's grace, a restart."""
    return wait_s + timeout_s + INTERRUPT_GRACE_S + 2 * (startup_timeout_s + STOP_S)


class _SandboxedKernelManager(KernelManager):
    """A KernelManager whose kernel command is this Python's ``ipykernel`` behind the sandbox's
    prefix, with ``-P -s`` (see the module doc)."""

    sandbox_options: dict

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        kernel = [sandbox.PYTHON, "-P", "-s", "-c", KERNEL_MAIN, "-f", self.connection_file]
        return sandbox.command_prefix(**self.sandbox_options) + kernel


@dataclass
class CellResult:
    """One executed cell: ``text`` is what the model reads."""

    text: str
    status: str  # "ok", "error", "timeout", "died", "busy" (not run), "closed"
    seconds: float
    truncated: bool = False  # the output was longer than max_chars: its middle was cut


class _Output:
    """A cell's output kept bounded while it arrives: its first ``max_chars // 2`` characters, its
    last ``max_chars - max_chars // 2`` and how many there were in all."""

    def __init__(self, max_chars: int) -> None:
        self.half = max(max_chars, 0) // 2
        self.head_room = self.half  # what the head may still take
        self.tail_max = max(max_chars, 0) - self.half
        self.head = ""
        self.tail: collections.deque[str] = collections.deque()
        self.tail_chars = 0
        self.total = 0

    def add(self, text: str) -> None:
        self.total += len(text)
        if self.head_room > 0:
            piece, text = text[: self.head_room], text[self.head_room :]
            self.head += piece
            self.head_room -= len(piece)
        if not text or not self.tail_max:
            return
        if len(text) >= self.tail_max:
            self.tail.clear()
            self.tail_chars = 0
            text = text[-self.tail_max :]
        self.tail.append(text)
        self.tail_chars += len(text)
        while self.tail_chars - len(self.tail[0]) >= self.tail_max:
            self.tail_chars -= len(self.tail.popleft())

    def skip(self, count: int) -> None:
        """``count`` characters the kernel cut from the middle of a message: what comes after them is
        not joined to what came before."""
        self.total += count
        self.head_room = 0
        self.tail.clear()
        self.tail_chars = 0

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + self.tail_chars

    def text(self) -> str:
        tail = "".join(self.tail)
        if not self.truncated:
            return self.head + tail
        tail = tail[-self.half :] if self.half else ""
        cut = self.total - len(self.head) - len(tail)
        return f"{self.head}\n[... output truncated: {cut} characters cut ...]\n{tail}"


def _attempt(step: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """``step(*args, **kwargs)``; a failure is logged."""
    try:
        step(*args, **kwargs)
    except Exception:
        log.exception("interpreter: stopping the kernel failed")


def _unencodable(code: str) -> str | None:
    """The error text for code UTF-8 cannot encode (a lone surrogate), else None."""
    try:
        code.encode("utf-8")
    except UnicodeEncodeError as err:
        char, line = code[err.start], code.count("\n", 0, err.start) + 1
        return (
            f"SyntaxError: the cell is not valid text: line {line} holds the lone surrogate {char!r}, "
            f"which UTF-8 cannot encode; inside a string, write it as the escape {char!r}"
        )
    return None


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


class _Owner:
    """One long-lived daemon thread that runs jobs in order and hands each result to its caller
    through a future. After :meth:`stop` it takes no more jobs."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._guard = threading.Lock()
        self._stopped = False
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def submit(self, fn: Callable[[], Any], release: threading.Lock | None = None) -> Future:
        """Run ``fn`` on the thread; ``release`` is released when it ends (or is dropped)."""
        future: Future = Future()
        with self._guard:
            if self._stopped:
                raise sandbox.SandboxError("the kernel is closed")
            self._jobs.put((fn, future, release))
        return future

    def stop(self, timeout: float) -> bool:
        """Run what is queued, then end the thread; whether it ended within ``timeout``."""
        with self._guard:
            self._stopped = True
            self._jobs.put(None)
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout)
        return not self.thread.is_alive()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, future, release = job
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn())
                    except BaseException as err:  # handed to the caller
                        future.set_exception(err)
            finally:
                if release is not None:
                    release.release()


class SandboxedKernel:
    """A kernel in its own sandboxed work dir (a fresh temporary one, removed by :meth:`close`).

    ``start=False`` leaves the kernel to start with the first cell (a start that fails is then that
    cell's text, and the next cell tries again); by default it starts now and a failure raises
    :class:`~dsv32.envs.sandbox.SandboxError`."""

    def __init__(
        self,
        *,
        workdir: str | None = None,
        memory_mb: int = 2048,
        cpu_s: float = 600,
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
        kind: str | None = None,
        start: bool = True,
        disk_mb: int = sandbox.DISK_MB,
    ) -> None:
        if disk_mb <= 0:
            raise sandbox.SandboxError("sandbox limits must be positive (disk_mb)")
        self.disk_mb = disk_mb
        self._disk: sandbox.DiskWatch | None = None  # the running kernel's
        self._own_dir = workdir is None
        self.workdir = os.path.realpath(workdir or sandbox.owned_tempdir("kernel"))
        if self._own_dir:
            _UNREMOVED.add(self.workdir)
        self.startup_timeout_s = startup_timeout_s
        options = {"cwd": self.workdir, "memory_mb": memory_mb, "timeout_s": cpu_s, "cpu_s": cpu_s}
        self._sandbox_options = {**options, "kind": kind}
        self.restarts = 0
        self.km: KernelManager | None = None
        self.kc = None
        self._run_dir: str | None = None  # the running kernel's sockets and IPython dir
        self._context: zmq.Context | None = None  # the client's sockets
        self._closed = threading.Event()
        self._free = threading.Lock()  # held from a job's submission to its end on the owner thread
        self._busy_until = 0.0  # when the running cell reaches its time limit (monotonic)
        self._owner = _Owner("dsv32-kernel")
        if start:
            try:
                self._exclusive(self._start, None, self.startup_timeout_s + STOP_S)
            except BaseException:
                self.close()
                raise

    # -- on the caller's thread -------------------------------------------------------------------

    def _exclusive(self, fn: Callable[[], Any], wait_s: float | None, limit_s: float) -> Any:
        """``fn()`` on the owner thread once no other job runs (waiting at most ``wait_s``; None: as
        long as it takes); ``_BUSY`` when the wait ran out, ``_LATE`` when ``fn`` took over
        ``limit_s``. Exceptions of ``fn`` are raised here."""
        if self._closed.is_set():
            raise sandbox.SandboxError("the kernel is closed")
        if not self._free.acquire(timeout=-1 if wait_s is None else max(wait_s, 0)):
            return _BUSY
        try:
            future = self._owner.submit(fn, release=self._free)
        except BaseException:
            self._free.release()
            raise
        try:
            return future.result(timeout=limit_s)
        except FutureTimeout:
            return _LATE

    def execute(
        self, code: str, *, timeout_s: float = 30, max_chars: int = 8000, wait_s: float | None = None
    ) -> CellResult:
        """Run one cell and return what it printed, its value and its error (see the module doc).
        While another cell runs, wait for it at most ``wait_s`` seconds (None: as long as it takes);
        past that this cell is not run and the result (status ``busy``) says so. Code that is not
        valid text (a lone surrogate, which UTF-8 cannot encode) is an error, not sent."""
        start = time.perf_counter()
        if (problem := _unencodable(code)) is not None:
            return CellResult(problem, "error", time.perf_counter() - start)
        limit = execute_bound_s(timeout_s, 0, self.startup_timeout_s)
        result = self._exclusive(lambda: self._run_cell(code, timeout_s, max_chars), wait_s, limit)
        if result is _BUSY:
            left = self._busy_until - time.monotonic()
            within = f"; it is stopped within {left:.0f} s" if left >= 1 else ""
            text = (
                "[this cell was not run: the kernel is still busy with an earlier cell (one whose call "
                f"stopped waiting for it{within}); run this cell again]"
            )
            return CellResult(text, "busy", time.perf_counter() - start)
        if result is _LATE:
            text = f"[the kernel did not answer within {limit:g} s; this cell's result is lost]"
            return CellResult(text, "timeout", time.perf_counter() - start)
        return result

    def restart(self) -> None:
        """A fresh kernel in the same work dir (files kept, variables lost)."""
        self._exclusive(self._restart, None, STOP_S + self.startup_timeout_s + STOP_S)

    def alive(self) -> bool:
        km = self.km
        return km is not None and km.is_alive()

    def close(self) -> None:
        """Stop the kernel (a running cell is abandoned within a fraction of a second) and remove its
        work dir; idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(sandbox.SandboxError):  # a close() alongside stopped it already
            self._owner.submit(self._stop)
        if not self._owner.stop(STOP_S):
            log.warning("interpreter: the kernel's thread did not stop within %g s", STOP_S)
        if self._own_dir:
            sandbox.remove_tree(self.workdir)
            _UNREMOVED.discard(self.workdir)

    def __enter__(self) -> SandboxedKernel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- on the owner thread ----------------------------------------------------------------------

    def _start(self) -> None:
        """Start a kernel; :class:`~dsv32.envs.sandbox.SandboxError` when it does not answer within
        ``startup_timeout_s`` (or exits, or cannot be launched, or its work dir is past its disk
        quota), with nothing left running."""
        quota = self.disk_mb << 20
        if sandbox.disk_usage([self.workdir], limit=quota) > quota:
            raise sandbox.SandboxError(
                f"the sandboxed Jupyter kernel was not started: {sandbox.over_quota(self.disk_mb)}"
            )
        deadline = time.monotonic() + self.startup_timeout_s
        while not _STARTING.acquire(timeout=min(1.0, max(deadline - time.monotonic(), 0))):
            if self._closed.is_set():  # in steps of a second, so that close() need not wait
                raise sandbox.SandboxError("the sandboxed Jupyter kernel was closed while waiting to start")
            if time.monotonic() >= deadline:
                raise sandbox.SandboxError(
                    f"the sandboxed Jupyter kernel was not started: {CONCURRENT_STARTS} other kernels of "
                    f"this process were starting for all of {self.startup_timeout_s:g} s"
                )
        held = True

        def answered() -> None:  # the CPU-heavy part is over: the next start may begin
            nonlocal held
            if held:
                held = False
                _STARTING.release()

        try:
            self._launch(quota, deadline, answered)
        finally:
            answered()

    def _launch(self, quota: int, deadline: float, answered: Callable[[], None]) -> None:
        self._run_dir = run_dir = sandbox.owned_tempdir("kernel-run")
        _UNREMOVED.add(run_dir)
        _RUNNING.add(self)
        profile = os.path.join(run_dir, "ipython", "profile_default")
        os.makedirs(os.path.join(profile, "startup"))
        with open(os.path.join(profile, "ipython_kernel_config.py"), "w") as f:
            f.write(KERNEL_CONFIG)
        bootstrap_copy = shutil.copyfile(bootstrap.__file__, os.path.join(run_dir, "bootstrap.py"))
        with open(os.path.join(profile, "startup", "00-dsv32.py"), "w") as f:
            f.write(_startup_file(bootstrap_copy))
        env = {"IPYTHONDIR": os.path.join(run_dir, "ipython"), "MPLBACKEND": "Agg"}
        km = _SandboxedKernelManager(
            transport="ipc",
            ip=os.path.join(run_dir, "kernel"),
            connection_file=os.path.join(run_dir, "kernel.json"),
            kernel_name="python3",
        )
        km.sandbox_options = {**self._sandbox_options, "env": env, "writable": [run_dir]}
        km.kernel_spec.interrupt_mode = "message"  # signals would stop at the sandbox's launcher
        self.km = km
        try:
            km.start_kernel(cwd=self.workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except Exception as err:  # the sandbox or the kernel could not be launched
            self._stop()
            raise sandbox.SandboxError(
                f"the sandboxed Jupyter kernel did not start: {type(err).__name__}: {err}"
            ) from err
        process = km.provisioner.process
        self._disk = sandbox.DiskWatch(
            [self.workdir, run_dir], quota, process.pid, lambda: sandbox.kill(process)
        )
        self._disk.start()
        self._connect(deadline, answered)

    def _connect(self, deadline: float | None = None, answered: Callable[[], None] | None = None) -> None:
        """A fresh client for the running kernel, ready by ``deadline`` (default: within
        ``startup_timeout_s``; a socket that refused a message does not reconnect); on failure the
        kernel is stopped and :class:`~dsv32.envs.sandbox.SandboxError` raised. ``answered`` is
        called once the kernel has answered a request on its shell channel, before the client's
        readiness check (which also waits for IOPub)."""
        if self.kc is not None:
            self.kc.stop_channels()
        if self._context is None:
            self._context = zmq.Context()  # its sockets' defaults: see MAX_MESSAGE_BYTES
            self._context.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
            self._context.setsockopt(zmq.RCVHWM, QUEUED_MESSAGES)
        try:
            self.kc = self.km.client(context=self._context)
            self.kc.start_channels()
        except Exception as err:
            self._stop()
            raise sandbox.SandboxError(
                f"the sandboxed Jupyter kernel could not be reached: {type(err).__name__}: {err}"
            ) from err
        deadline = deadline if deadline is not None else time.monotonic() + self.startup_timeout_s

        def step() -> float:  # in steps of a second, so that close() need not wait for the whole timeout
            return min(1.0, max(deadline - time.monotonic(), 0))

        while True:
            try:
                if answered is not None:
                    self._answer(step())
                    answered()
                    answered = None
                self.kc.wait_for_ready(timeout=step())
                return
            except RuntimeError:
                if self._closed.is_set():
                    problem = "it was closed while starting"
                elif not self.km.is_alive():
                    problem = "it exited while starting"
                elif time.monotonic() >= deadline:
                    problem = f"it did not answer within {self.startup_timeout_s:g} s"
                else:
                    continue
            self._stop()
            raise sandbox.SandboxError(f"the sandboxed Jupyter kernel did not start: {problem}")

    def _answer(self, timeout: float) -> None:
        """A ``kernel_info`` request answered on the shell channel within ``timeout`` (a request
        sent before the kernel listens waits in its socket); RuntimeError, as the client's own
        readiness check raises, when no answer came."""
        self.kc.kernel_info()
        try:
            self.kc.get_shell_msg(timeout=timeout)
        except queue.Empty:
            raise RuntimeError("the kernel has not answered yet") from None

    def _stop(self) -> None:
        km, kc, run_dir, context, disk = self.km, self.kc, self._run_dir, self._context, self._disk
        self.km = self.kc = self._run_dir = self._context = self._disk = None
        if disk is not None:
            disk.stop()
            disk.join(timeout=STOP_S)
        if kc is not None:  # each step whatever the one before did
            _attempt(kc.stop_channels)
        if context is not None:
            _attempt(context.destroy, linger=0)
        if km is not None:
            if km.has_kernel:
                _attempt(km.shutdown_kernel, now=True)
            _attempt(km.cleanup_resources)
        if run_dir is not None:
            sandbox.remove_tree(run_dir)
            _UNREMOVED.discard(run_dir)

    def _restart(self) -> None:
        self._stop()
        self.restarts += 1
        self._start()

    def _past_quota(self) -> tuple[str, str]:
        """Stop the kernel the disk watch killed and empty its work dir when it is its own: what
        happened and what is lost, in words for the model."""
        self._stop()
        what = f"the files in the work dir went past its disk quota of {self.disk_mb} MB: the Python kernel was stopped"
        if not self._own_dir:
            return what, "variables are lost"
        sandbox.remove_tree(self.workdir)
        os.makedirs(self.workdir, mode=0o700, exist_ok=True)
        return what + " and the work dir emptied", "variables and files are lost"

    def _run_cell(self, code: str, timeout_s: float, max_chars: int) -> CellResult:
        """:meth:`_cell`; a failure of this side (ZeroMQ, ``jupyter_client``) is the cell's text and
        the kernel is restarted."""
        start = time.perf_counter()
        try:
            return self._cell(code, timeout_s, max_chars)
        except Exception as err:
            log.exception("interpreter: running a cell failed")
            text = f"[running this cell failed ({type(err).__name__}: {err}); "
            try:
                self._restart()
                text += "the Python kernel was restarted: variables are lost]"
            except Exception as again:
                text += f"the Python kernel could not be restarted ({again}); the next cell starts it again]"
            return CellResult(text, "died", time.perf_counter() - start)

    def _cell(self, code: str, timeout_s: float, max_chars: int) -> CellResult:
        start = time.perf_counter()
        if self._closed.is_set():
            return CellResult("[the kernel was closed; this cell was not run]", "closed", 0.0)
        before = []
        if self._disk is not None and self._disk.over:  # between cells: a thread a cell started wrote
            what, gone = self._past_quota()
            before.append(f"[before this cell, {what}; a fresh kernel runs this cell: {gone}]")
            self.restarts += 1
        starting = self.startup_timeout_s if self.kc is None else 0
        self._busy_until = time.monotonic() + starting + timeout_s + INTERRUPT_GRACE_S
        if self.kc is None:  # not started yet (start=False), or a restart failed
            try:
                self._start()
            except sandbox.SandboxError as err:
                text = "\n".join([*before, f"[{err}; this cell was not run; the next cell tries again]"])
                return CellResult(text, "died", time.perf_counter() - start)
        msg_id = self.kc.execute(code, store_history=True, allow_stdin=False)
        output, notes = _Output(max_chars), []
        status, failed = self._collect(msg_id, time.monotonic() + timeout_s, output)
        lost = status == "lost"
        if status == "timeout":
            self.km.interrupt_kernel()
            after = self._collect(msg_id, time.monotonic() + INTERRUPT_GRACE_S, _Output(0))[0]
            lost = after == "lost"
            if after == "closed":
                status = "closed"
            elif after in ("idle", "lost"):
                notes.append(
                    f"[interrupted: the cell ran past its {timeout_s:g} s limit; variables are kept]"
                )
            else:
                status = "died"
                notes.append(f"[the cell ran past {timeout_s:g} s and did not stop when interrupted]")
        if status == "closed":
            return CellResult(
                "[the kernel was closed while this cell ran]", status, time.perf_counter() - start
            )
        if lost:
            notes.append(
                f"[some of this cell's output was dropped: a message over {MAX_MESSAGE_BYTES >> 20} MiB, "
                "or more messages than could be read]"
            )
            try:
                self._connect()  # the socket that refused a message is closed for good
            except sandbox.SandboxError:
                status = "died"
        if status == "died":
            what, gone = "the Python kernel died (a limit or an exit)", "variables are lost"
            if self._disk is not None and self._disk.over:
                what, gone = self._past_quota()
            try:
                self._restart()
                notes.append(f"[{what}; it was restarted: {gone}]")
            except sandbox.SandboxError as err:
                notes.append(
                    f"[{what} and could not be restarted ({err}); {gone}; the next cell starts it again]"
                )
        text = "\n".join(t for t in [*before, output.text().rstrip("\n"), *notes] if t) or "[no output]"
        if _unencodable(text) is not None:  # what the kernel sent may hold lone surrogates too
            text = text.encode("utf-8", "backslashreplace").decode("utf-8")
        final = ("error" if failed else "ok") if status in ("idle", "lost") else status
        return CellResult(text, final, time.perf_counter() - start, output.truncated)

    def _collect(self, msg_id: str, deadline: float, output: _Output) -> tuple[str, bool]:
        """Read this cell's iopub messages into ``output`` until it is idle ("idle"), its reply is in
        but its last messages were refused ("lost"), the deadline passes ("timeout"), the kernel dies
        ("died") or is being closed ("closed"); also whether it raised."""
        failed, replied = False, None
        while True:
            if self._closed.is_set():
                return "closed", failed
            if time.monotonic() > deadline:
                return "timeout", failed
            try:
                msg = self.kc.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                if not self.km.is_alive():
                    return "died", failed
                if replied is None and self._replied(msg_id):
                    replied = time.monotonic()
                if replied is not None and time.monotonic() - replied > REPLY_QUIET_S:
                    return "lost", failed
                continue
            try:
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                kind, content = msg["msg_type"], msg["content"]
                if kind == "stream":
                    _add_text(output, content.get("text", ""), content.get("dsv32_cut"))
                elif kind in ("execute_result", "display_data") and "text/plain" in content.get("data", {}):
                    _add_text(output, content["data"]["text/plain"], content.get("dsv32_cut"), "\n")
                elif kind == "error":
                    output.add(_error_text(content) + "\n")
                    failed = True
                elif kind == "status" and content["execution_state"] == "idle":
                    return "idle", failed
            except (AttributeError, KeyError, TypeError, ValueError):  # a malformed message: skipped
                continue

    def _replied(self, msg_id: str) -> bool:
        """Whether the shell replies read now (all that are in: nothing else reads them) include
        this cell's."""
        found = False
        while True:
            try:
                msg = self.kc.get_shell_msg(timeout=0)
            except queue.Empty:
                return found
            with contextlib.suppress(AttributeError, KeyError, TypeError):  # a malformed message
                found = found or msg["parent_header"].get("msg_id") == msg_id


def _add_text(output: _Output, text: object, cut: object, end: str = "") -> None:
    """A message's text; one the kernel cut (``dsv32_cut``: the count) is its head and tail around
    what it cut."""
    text = str(text)
    if type(cut) is int and cut > 0 and len(text) == 2 * bootstrap.KEEP:
        output.add(text[: bootstrap.KEEP])
        output.skip(cut)
        output.add(text[bootstrap.KEEP :] + end)
    else:
        output.add(text + end)


_BUSY, _LATE = object(), object()
