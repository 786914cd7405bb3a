"""The one way ``dsv32.envs`` runs model-written code: a confined child process.

``run(argv, timeout_s=..., memory_mb=...)`` starts ``argv`` in its own session (process group) and
working directory, under three layers, the strongest this machine allows (probed once, see
:func:`isolation`):

- ``bwrap`` (bubblewrap installed): new user, PID, IPC, UTS (and, unless ``network=True``, network)
  namespaces, the filesystem view below, no nested user namespaces (``--disable-userns``, where
  this bubblewrap has it), every capability dropped.
- ``unshare`` (user namespaces work): the same namespaces; ``_confine.py`` builds the same view
  (from an empty tmpfs, then ``pivot_root``), sets ``user.max_user_namespaces`` to 0 in the
  sandbox's user namespace and drops every capability (so the program cannot remount anything).
- ``rlimits`` (neither works): resource limits and the process group only — the network, the host
  filesystem and the other processes of the host user are reachable; a warning says so.

The filesystem view (``_view.py``) is an allowlist: an empty root into which only what the program
needs is bound — ``/usr``, ``/bin``, ``/sbin``, ``/lib*``, ``/etc`` without its secrets (a synthetic
``passwd`` and ``group``; no ``shadow``, ``gshadow``, ssh host keys, sudoers), the Python installation
and import path of this process but the project's source (:func:`runtime_paths`) and the
``readable`` paths, read-only; the work dir and ``writable`` read-write; a fresh ``/proc``, a minimal
``/dev`` with a private ``/dev/shm``, a private ``/tmp``. Nothing else of the host is there: no
home, ``/root``, ``/var``, ``/srv``, ``/opt``, ``/mnt``, ``/run``, cache or output directory, nor the
Unix sockets in them. Every task file this process has read (``base.TASK_FILES``) that lies in a
visible path has ``/dev/null`` bound over it. :attr:`Isolation.visible` lists what is shown.

Processes: ``setrlimit`` bounds CPU seconds (``RLIMIT_CPU``), address space (``RLIMIT_AS`` =
``memory_mb``, per process), processes (``RLIMIT_NPROC``), open files and file size. The kernel
never applies ``RLIMIT_NPROC`` to host root, so when this process is root a launcher
(``_confine.py``) runs each sandbox as a host user id of its own (:func:`sandbox_uids`: one of
65536 ids from 2,100,000,000, none shared by two sandboxes at a time), after giving it the work
dir and ``writable`` (``chown -R``; root reads and removes them afterwards); as another user, the
count is kept in the sandbox's own user namespace. :func:`process_bound` says which applies. The
environment is a fresh minimal one (nothing of the host's, API keys included, leaks in); stdout
and stderr are capped at ``output_bytes`` each (the program is killed when it goes past); and a
wall-time timeout kills the whole process group — and with a PID namespace, everything the
program started, even processes that left the group, since they die with the namespace's first
process.

Disk: :func:`run` keeps what the program holds in the work dir and ``writable`` within
``disk_mb`` (default 1024): :class:`DiskWatch` (one thread of this process serves every watch) measures it with
:func:`disk_usage` while the program runs and kills it past the quota; a work dir already past it
is not run; either is ``killed_reason="disk limit"``. The Jupyter kernel
(``envs/interpreter/kernel.py``) runs the same watch. ``/dev/shm`` and ``/tmp`` are private tmpfs
of ``min(64 MB, memory_mb)`` each under ``unshare`` and under ``bwrap`` 0.10 or later (an older
bubblewrap cannot size a tmpfs: there they are empty read-only directories), so
``multiprocessing`` works and what they hold is bounded. Under ``rlimits`` only the work dir is
watched, and the program can write wherever the host user can.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import math
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from dsv32.envs import _view
from dsv32.envs.base import TASK_FILES, EnvError

log = logging.getLogger(__name__)

CONFINE = str(Path(__file__).with_name("_confine.py"))
# This Python by a normalised path: the one to run inside a sandbox. ``sys.executable`` keeps the path
# the interpreter was started by (``benchmarks/../.venv/bin/python``), and such a path need not exist
# in the sandbox's view, which holds real paths only; :func:`popen` and :func:`run` replace it.
PYTHON = os.path.abspath(sys.executable)
KINDS = ("bwrap", "unshare", "rlimits")
BASE_ENV = {
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
    "MALLOC_ARENA_MAX": "2",
}
DISK_MB = 1024  # the default disk quota of a run's work dir and writable paths
SHM_MB = 64  # the most a private /dev/shm holds (no more than memory_mb)
# Every name under a watched directory counts at least this much: the disk a filesystem sets aside
# for one inode (mke2fs's default ratio), so a flood of empty files or links counts, and a tree
# within the quota has at most quota / ENTRY_BYTES names (which bounds the time of one walk).
ENTRY_BYTES = 16 << 10
DISK_POLL_S = 0.02  # how often the watch reads the free space of the watched filesystems
DISK_PERIOD_S = (0.5, 2.0)  # the shortest and longest time between two regular walks of the tree
DISK_WALK_SHARE = 0.05  # the share of a core the regular walks of all watches may take (then: longer periods)


class SandboxError(EnvError):
    """A sandbox that cannot be set up as asked (an isolation this machine lacks, a bad limit)."""


@dataclass(frozen=True)
class Isolation:
    """What confines a sandboxed program, in words a user can check: ``visible`` lists the host
    paths its filesystem view shows (empty under ``rlimits``, which has no view: everything the host
    user reads is there), ``processes`` says what bounds the number of its processes."""

    kind: str
    namespaces: bool
    read_only_fs: bool
    network_isolated: bool
    note: str
    visible: tuple[str, ...] = ()
    processes: str = ""


_NOTES = {
    "bwrap": "bubblewrap: user/pid/ipc/uts/net namespaces, an allowlisted read-only filesystem view (system "
    "directories, /etc without its secrets, the Python runtime) with the work dir writable, task files "
    "masked, no nested user namespaces, no capabilities, rlimits",
    "unshare": "unshare: user/pid/mount/ipc/uts/net namespaces, an allowlisted read-only filesystem view "
    "(system directories, /etc without its secrets, the Python runtime) with the work dir writable, task "
    "files masked, no nested user namespaces, no capabilities, rlimits",
    "rlimits": "NO ISOLATION: neither bubblewrap nor unprivileged user namespaces work here; only rlimits "
    "and the process group apply — the program can use the network, write wherever this user can "
    "and signal this user's processes",
}
UIDS = (2_100_000_000, 65536)  # the host user ids sandboxes started by root run as: (base, count)


def process_bound(kind: str) -> str:
    """What bounds the number of a sandbox's processes (``processes=``) under ``kind`` here."""
    if kind == "rlimits":
        if os.geteuid() == 0:
            return "none: RLIMIT_NPROC does not apply to root, and rlimits runs the program as root"
        return "RLIMIT_NPROC of the host user: its processes now plus the sandbox's budget"
    if own_user_ids():
        base, count = sandbox_uids()
        return (
            f"RLIMIT_NPROC of a host user id of the sandbox's own (one of {base}..{base + count - 1}, "
            "held by no other sandbox while it runs)"
        )
    return "RLIMIT_NPROC counted in the sandbox's own user namespace (the host user's other processes do not count)"


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


@cache
def _interpreter_path() -> tuple[str, ...]:
    """The import path this process's interpreter starts with (``sys.path[1:]`` of a fresh one: this
    process's own also holds its script's directory). Asked once (~30 ms)."""
    probe = "import json, sys; print(json.dumps(sys.path[1:]))"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    try:
        done = subprocess.run(
            [sys.executable, "-c", probe], cwd="/", env=env, capture_output=True, timeout=60
        )
        return tuple(json.loads(done.stdout))
    except (OSError, subprocess.TimeoutExpired, ValueError) as err:
        log.warning("sandbox: could not read the interpreter's import path (%s); using this process's", err)
        return tuple(sys.path[1:])


@cache
def project_dirs() -> tuple[str, ...]:
    """Where this project's source is, as real paths: the ``dsv32`` package this process runs and
    any other on the interpreter's import path (an editable install's), each as its source checkout
    (the folder above ``src/dsv32`` holding ``pyproject.toml``, with its git history) when it is one,
    else the package folder. They hold the task sets and their answers, so a sandboxed program does
    not see them (:func:`runtime_paths` leaves them out of the view)."""
    packages = [os.path.dirname(os.path.dirname(os.path.realpath(__file__)))]
    packages += [os.path.join(p, "dsv32") for p in _interpreter_path() if p]
    found = []
    for package in packages:
        package = os.path.realpath(package)
        if not os.path.isfile(os.path.join(package, "__init__.py")):
            continue
        source, checkout = os.path.dirname(package), os.path.dirname(os.path.dirname(package))
        is_checkout = os.path.basename(source) == "src" and os.path.isfile(
            os.path.join(checkout, "pyproject.toml")
        )
        found.append(checkout if is_checkout else package)
    return tuple(_outermost(found))


def _project_source(path: str) -> bool:
    """Whether ``path`` is inside the project's source (:func:`project_dirs`) and not a Python
    installation there (a virtual environment in the checkout is one)."""
    if not _under(path, project_dirs()):
        return False
    return not any(_under(path, [p]) for p in _installations() if _under(p, project_dirs()))


@cache
def _installations() -> tuple[str, ...]:
    return tuple(
        os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)
    )


@cache
def runtime_paths() -> tuple[str, ...]:
    """What a program started with this process's Python needs to see: the interpreter's directory,
    this package's confine stage (the one file) and the import path that interpreter starts with
    (standard library, site-packages, the directories ``.pth`` files add) as real paths — but
    nothing of the project's source (:func:`project_dirs`: a source directory an editable install
    adds is left out)."""
    path = [os.path.realpath(p) for p in _interpreter_path() if p]
    path = [p for p in path if not _project_source(p)]
    paths = [os.path.dirname(os.path.realpath(PYTHON)), os.path.realpath(CONFINE), *path]
    paths += _installations()  # shared libraries
    real = [os.path.realpath(p) for p in paths if p]
    return tuple(p for p in dict.fromkeys(real) if os.path.exists(p))


def _under(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _outermost(paths: Sequence[str]) -> list[str]:
    """``paths`` without those inside another one of them (binding the outer one binds them)."""
    unique = sorted(set(paths), key=len)
    kept: list[str] = []
    for p in unique:
        if not _under(p, kept):
            kept.append(p)
    return kept


def sandbox_uids() -> tuple[int, int]:
    """The host user ids a sandbox started by root runs as: ``(base, count)``, from
    ``$DSV32_SANDBOX_UIDS`` (``BASE:COUNT``) or :data:`UIDS`; each sandbox takes one no other
    sandbox holds (see ``_confine.py``)."""
    raw = os.environ.get("DSV32_SANDBOX_UIDS")
    if not raw:
        return UIDS
    try:
        base, count = (int(x) for x in raw.split(":"))
    except ValueError:
        raise SandboxError(f"DSV32_SANDBOX_UIDS must be BASE:COUNT, not {raw!r}") from None
    if base <= 0 or count <= 0 or base + count > 2**32 - 2:
        raise SandboxError(f"DSV32_SANDBOX_UIDS {raw!r}: the ids must lie in 1..{2**32 - 3}")
    return base, count


def own_user_ids() -> bool:
    """Whether sandboxes run as user ids of their own: this process is root and the ids of
    :func:`sandbox_uids` exist in its user namespace (root of a container whose namespace maps
    fewer ids is a host user the process limit applies to: there the sandbox maps root to it)."""
    if os.geteuid() != 0:
        return False
    base, count = sandbox_uids()
    try:
        ranges = [
            [int(x) for x in line.split()] for line in Path("/proc/self/uid_map").read_text().splitlines()
        ]
    except (OSError, ValueError):
        return False
    return any(inside <= base and base + count <= inside + n for inside, _outside, n in ranges)


def _uid_lock_dir() -> str:
    """Where the launchers of all root processes hold the locks of the sandbox user ids they use."""
    base = next((d for d in ("/run/lock", "/var/lock") if os.path.isdir(d) and os.access(d, os.W_OK)), "/tmp")
    return os.path.join(base, "dsv32-sandbox-uids")


@cache
def _etc_files() -> dict[str, str]:
    """Host files holding the view's synthetic ``/etc`` files (bubblewrap binds files in)."""
    folder = tempfile.mkdtemp(prefix="dsv32-etc-")
    os.chmod(folder, 0o755)
    files = {"/etc/passwd": _view.PASSWD, "/etc/group": _view.GROUP}
    paths = {}
    for path, text in files.items():
        paths[path] = os.path.join(folder, os.path.basename(path))
        Path(paths[path]).write_text(text)
        os.chmod(paths[path], 0o644)
    atexit.register(shutil.rmtree, folder, True)
    return paths


def release() -> None:
    """Remove the files this process keeps for its sandboxes' life (the view's ``/etc`` files, made
    on first use and otherwise removed at exit); the next sandbox makes them again. For a process
    that is killed rather than exits (a Ray actor), call it first."""
    if _etc_files.cache_info().currsize:
        folder = os.path.dirname(next(iter(_etc_files().values())))
        _etc_files.cache_clear()
        shutil.rmtree(folder, ignore_errors=True)


def _view_steps(network: bool, writable: Sequence[str], readable: Sequence[str], tmp_bytes: int) -> list:
    """The view (``_view.plan``) of a program started with this process's Python."""
    runtime = [*runtime_paths(), PYTHON]
    masks = [f for f in TASK_FILES if os.path.isfile(f)]
    return _view.plan(
        runtime=runtime,
        readable=readable,
        writable=writable,
        masks=masks,
        network=network,
        tmp_bytes=tmp_bytes,
        private=own_user_ids(),  # (the program runs as a user id of its own)
    )


def _prefix_for(
    kind: str, network: bool, writable: Sequence[str], readable: Sequence[str], shm_bytes: int
) -> tuple[list[str], dict, list[str]]:
    """``(argv prefix before the confine stage, what the confine stage does, the launcher's argv
    prefix when there is one)``. A launcher (``_confine.py`` as root, see its doc) runs first when
    this process is root, so the sandbox runs as a user id of its own."""
    if kind == "rlimits":
        return [], {}, []
    steps = _view_steps(network, writable, readable, shm_bytes)
    root = own_user_ids()
    pdeath = ["setpriv", "--pdeathsig", "KILL"] if shutil.which("setpriv") else []
    uids = [_uid_lock_dir(), *sandbox_uids()]
    if kind == "bwrap":
        argv = [shutil.which("bwrap") or "bwrap", "--unshare-user", "--uid", "0", "--gid", "0"]
        argv += ["--unshare-pid", "--as-pid-1"]
        argv += ["--unshare-ipc", "--unshare-uts"] + ([] if network else ["--unshare-net"])
        argv += ["--die-with-parent"] + (["--disable-userns"] if _bwrap_has("--disable-userns") else [])
        argv += _view.bwrap_args(steps, _etc_files(), _bwrap_sizes_tmpfs())
        argv += ["--remount-ro", "/", "--cap-drop", "ALL"]
        if not root:
            return argv, {}, []
        binds = [i for i, a in enumerate(argv) if a in ("--ro-bind", "--bind") and i > 0]
        launch = {"launch": "bwrap", "uids": uids, "writable": list(writable), "binds": binds}
        return argv, {}, [*pdeath, PYTHON, "-I", "-S", CONFINE, json.dumps(launch)]
    spec = {"view": steps, "drop_privileges": True}
    if root:
        spec |= {"launch": "unshare", "uids": uids, "network": network, "become_root": True}
        return pdeath, spec, []
    argv = [*pdeath, "unshare", "--user", "--map-root-user", "--pid", "--fork", "--kill-child"]
    argv += ["--mount", "--ipc", "--uts"] + ([] if network else ["--net"])
    return argv, spec, []


@cache
def _bwrap_help() -> str:
    try:
        done = subprocess.run(["bwrap", "--help"], capture_output=True, timeout=10, env={"PATH": os.defpath})
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (done.stdout + done.stderr).decode(errors="replace")


def _bwrap_has(option: str) -> bool:
    return option in _bwrap_help()


def _bwrap_sizes_tmpfs() -> bool:
    """Whether this machine's bubblewrap takes ``--size`` before ``--tmpfs`` (0.10 and later)."""
    return _bwrap_has("--size")


@cache
def _works(kind: str) -> bool:
    if kind == "rlimits":
        return True
    if shutil.which(kind) is None:
        return False
    with tempfile.TemporaryDirectory(prefix="dsv32-probe-") as tmp:
        argv = [*command_prefix(cwd=tmp, memory_mb=256, timeout_s=10, kind=kind), "true"]
        try:
            done = subprocess.run(argv, capture_output=True, timeout=20, env={"PATH": os.defpath})
        except (OSError, subprocess.TimeoutExpired):
            return False
    if done.returncode != 0:
        log.info("sandbox: %s does not work here: %s", kind, done.stderr.decode(errors="replace").strip())
    return done.returncode == 0


def isolation(kind: str | None = None) -> Isolation:
    """The isolation a sandbox gets: ``kind`` if given (an error if it does not work here), else
    ``$DSV32_SANDBOX`` if set, else the strongest that works (bwrap, unshare, rlimits)."""
    kind = kind or os.environ.get("DSV32_SANDBOX") or None
    if kind is not None and kind not in KINDS:
        raise SandboxError(f"unknown sandbox isolation {kind!r}; choose one of {', '.join(KINDS)}")
    if kind is not None and not _works(kind):
        raise SandboxError(f"sandbox isolation {kind!r} does not work on this machine; {_hint(kind)}")
    chosen = kind or next(k for k in KINDS if _works(k))
    if chosen == "rlimits" and kind is None:  # the fallback, not a caller's or $DSV32_SANDBOX's choice
        _warn_once()
    confined = chosen != "rlimits"
    shown = _view.visible(_view_steps(False, [], [], 1 << 20)) if confined else ()
    note = _NOTES[chosen]
    if chosen == "bwrap" and not _bwrap_has("--disable-userns"):
        note = note.replace(
            "no nested user namespaces", "nested user namespaces allowed (no --disable-userns)"
        )
    return Isolation(chosen, confined, confined, confined, note, shown, process_bound(chosen))


def _hint(kind: str) -> str:
    if kind == "bwrap":
        return "install bubblewrap (apt-get install bubblewrap) or use 'unshare'"
    return "the kernel must allow unprivileged user namespaces (sysctl user.max_user_namespaces > 0)"


@cache
def _warn_once() -> None:
    log.warning("sandbox: %s", _NOTES["rlimits"])


def _host_processes() -> int:
    uid = os.geteuid()
    return sum(1 for p in Path("/proc").iterdir() if p.name.isdigit() and _owner(p) == uid)


def _owner(p: Path) -> int:
    try:
        return p.stat().st_uid
    except OSError:
        return -1


def command_prefix(
    *,
    cwd: str | os.PathLike,
    memory_mb: int,
    timeout_s: float,
    cpu_s: float | None = None,
    network: bool = False,
    env: dict[str, str] | None = None,
    writable: Sequence[str | os.PathLike] = (),
    readable: Sequence[str | os.PathLike] = (),
    processes: int = 64,
    open_files: int = 256,
    file_size_mb: int = 64,
    kind: str | None = None,
    status_fd: int | None = None,
) -> list[str]:
    """The argv prefix that runs a program confined: ``prefix + [program, *args]``. For long-lived
    programs (a Jupyter kernel) start it with :func:`popen` or put this prefix in front of its
    command; ``cpu_s`` (default ``timeout_s + 1``) bounds its CPU seconds for its whole life.
    ``cwd`` and ``writable`` are read-write; ``readable`` names paths the program must see besides
    the view's allowlist (see the module doc), read-only, as do absolute ``PYTHONPATH`` entries of
    ``env``."""
    if memory_mb <= 0 or timeout_s <= 0 or processes <= 0 or open_files <= 0 or file_size_mb <= 0:
        raise SandboxError("sandbox limits must be positive (memory_mb, timeout_s, processes, files)")
    if kind not in KINDS:
        kind = isolation(kind).kind
    cwd = os.path.realpath(cwd)
    rw = [cwd] + [os.path.realpath(w) for w in writable]
    cpu = math.ceil(cpu_s if cpu_s is not None else timeout_s + 1)
    nproc = processes if kind != "rlimits" else _host_processes() + processes
    limits = {
        "RLIMIT_CPU": [cpu, cpu + 1],
        "RLIMIT_AS": [memory_mb << 20] * 2,
        "RLIMIT_NPROC": [nproc] * 2,
        "RLIMIT_NOFILE": [open_files] * 2,
        "RLIMIT_FSIZE": [file_size_mb << 20] * 2,
        "RLIMIT_CORE": [0, 0],
    }
    full_env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": cwd, "TMPDIR": cwd, **BASE_ENV}
    full_env.update(env or {})
    imports = [
        p for p in full_env.get("PYTHONPATH", "").split(os.pathsep) if os.path.isabs(p) and os.path.exists(p)
    ]
    ro = [os.path.abspath(r) for r in [*readable, *imports]]  # (the view keeps symlinks on the way)
    prefix, spec, launcher = _prefix_for(kind, network, rw, ro, min(SHM_MB, memory_mb) << 20)
    spec |= {"writable": rw, "limits": limits, "cwd": cwd, "env": full_env, "status_fd": status_fd}
    return [*launcher, *prefix, PYTHON, "-I", "-S", CONFINE, json.dumps(spec)]


def popen(argv: Sequence[str], *, cwd: str | os.PathLike, **options) -> subprocess.Popen:
    """Start ``argv`` confined (keyword ``options`` as :func:`command_prefix`; ``stdin``,
    ``stdout``, ``stderr`` go to :class:`subprocess.Popen`), in a new session: stop it with
    :func:`kill`. Under ``bwrap`` and ``unshare`` the program is killed when the *thread* that
    started it ends (the kernel's parent-death signal): start a long-lived program from a thread
    that lives as long as it should."""
    streams = {k: options.pop(k) for k in ("stdin", "stdout", "stderr") if k in options}
    argv = command_prefix(cwd=cwd, **options) + _normalised(argv)
    fds = () if options.get("status_fd") is None else (options["status_fd"],)
    return subprocess.Popen(
        argv, cwd=cwd, start_new_session=True, env={"PATH": os.defpath}, pass_fds=fds, **streams
    )


def _normalised(argv: Sequence[str]) -> list[str]:
    """``argv`` with this Python's ``sys.executable`` (as started, perhaps through ``..``) as
    :data:`PYTHON`, the path by which the sandbox's view holds it."""
    return [PYTHON if i == 0 and a == sys.executable else a for i, a in enumerate(argv)]


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL the process group of a sandboxed process (with a PID namespace, everything in it)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


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


def disk_usage(
    paths: Sequence[str | os.PathLike], *, pids: Sequence[int] = (), limit: int | None = None
) -> int:
    """The bytes a sandboxed program holds on disk: everything under ``paths`` — each file's
    allocated size (``st_blocks * 512``, so a sparse file counts what it holds), each name at least
    :data:`ENTRY_BYTES`, a hard-linked file's blocks once, symlinks not followed — and the deleted
    files that the processes ``pids`` and their descendants hold open, or mapped from the watched
    filesystems (a deleted file keeps its blocks while it is held). Files that vanish meanwhile are
    skipped; a tree of any depth is read at the same cost per name (:func:`_tree_bytes`); a
    directory of this user that its owner made unreadable (``chmod 000``) is read after giving the
    owner read and search permission back for the time of the walk. With ``limit``, the walk stops
    once the total passes it (the total is then a part, already over the limit)."""
    seen: set[tuple[int, int]] = set()  # (device, inode) of the files counted
    budget = math.inf if limit is None else limit
    total, devices = 0, set()
    for root in _outermost([os.path.realpath(p) for p in paths]):
        with contextlib.suppress(OSError):
            devices.add(os.stat(root).st_dev)
        total += _tree_bytes(root, seen, budget - total)
        if total > budget:
            return total
    for pid in _process_tree(pids):
        total += _held_files(pid, devices, seen)
    return total


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def _tree_bytes(root: str, seen: set[tuple[int, int]], budget: float) -> int:
    """What :func:`disk_usage` counts under directory ``root``, stopping past ``budget``. Depth
    first, through directory descriptors (each name is looked up in its own directory, so a deep
    tree costs no more per name, and names past ``PATH_MAX`` are read too), with at most three open:
    the root's, the current directory's and its parent's, which is reached again through ``..``
    (or, where the program moved a directory meanwhile, from the root by name)."""
    opened = _open_dir(root, None, None)
    if opened is None:
        return 0
    root_fd, restore = opened
    fd = os.dup(root_fd)
    try:
        total, subdirs, ident = _list(fd, seen, budget)
        path = [[root, ident, subdirs, restore]]  # the current directory and its ancestors
        while path:
            if total > budget:  # past it: leave the rest unread (and set back the modes on the way up)
                for frame in path:
                    frame[2].clear()
            _name, _ident, subdirs, restore = path[-1]
            if subdirs:
                child = subdirs.pop()
                opened = _open_dir(child[0], fd, child[1])
                if opened is None:  # gone since it was listed
                    continue
                size, grandchildren, ident = _list(opened[0], seen, budget - total)
                total += size
                os.close(fd)
                fd = opened[0]
                path.append([child[0], ident, grandchildren, opened[1]])
                continue
            path.pop()
            parent = _back_up(fd, root_fd, path) if path else None
            _set_back(fd, restore)
            os.close(fd)
            fd = parent
            if path and fd is None:  # the way back is gone: carry on from the root
                del path[1:]
                fd = os.dup(root_fd)
        return total
    finally:
        if fd is not None:
            os.close(fd)
        os.close(root_fd)


def _list(fd: int, seen: set[tuple[int, int]], budget: float) -> tuple[int, list, tuple[int, int]]:
    """The bytes of the names in directory ``fd`` (not what its subdirectories hold), its
    subdirectories as ``(name, st_mode, st_uid)`` and its ``(device, inode)``."""
    info = os.fstat(fd)
    total, subdirs = 0, []
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:  # gone since it was listed
                    continue
                key = (st.st_dev, st.st_ino)
                if stat.S_ISDIR(st.st_mode):
                    subdirs.append((entry.name, st))
                total += ENTRY_BYTES if key in seen else max(st.st_blocks * 512, ENTRY_BYTES)
                seen.add(key)
                if total > budget:
                    break
    except OSError:
        pass
    return total, subdirs, (info.st_dev, info.st_ino)


def _open_dir(name: str, dir_fd: int | None, st: os.stat_result | None) -> tuple[int, int | None] | None:
    """A descriptor to read directory ``name`` (in ``dir_fd``; ``st``: its lstat, when known) and
    the mode to set back when the walk leaves it: one of this user (not root, who reads any)
    without its owner's read or search permission gets them meanwhile. None when it is gone or no
    longer a directory (a symlink is not followed)."""
    me = os.geteuid()
    if me == 0 or (st is not None and (st.st_uid != me or st.st_mode & 0o500 == 0o500)):
        try:
            return os.open(name, _DIR | os.O_NOFOLLOW, dir_fd=dir_fd), None
        except PermissionError:  # its mode changed since it was listed
            pass
        except OSError:
            return None
    try:  # through a path-only descriptor, which needs no permission on the directory itself
        at = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        info = os.fstat(at)
        mode = stat.S_IMODE(info.st_mode)
        if info.st_uid != me or mode & 0o500 == 0o500:
            return os.open(f"/proc/self/fd/{at}", _DIR), None
        os.chmod(f"/proc/self/fd/{at}", mode | 0o500)
        try:
            return os.open(f"/proc/self/fd/{at}", _DIR), mode
        except OSError:
            os.chmod(f"/proc/self/fd/{at}", mode)
            raise
    except OSError:
        return None
    finally:
        os.close(at)


def _back_up(fd: int, root_fd: int, path: list) -> int | None:
    """A descriptor of the directory of ``path[-1]``, the parent of directory ``fd``: through
    ``..`` when that is still it, else from the root by the names on ``path``; None when it is gone."""
    with contextlib.suppress(OSError):
        up = os.open("..", _DIR, dir_fd=fd)
        info = os.fstat(up)
        if (info.st_dev, info.st_ino) == path[-1][1]:
            return up
        os.close(up)
    current = os.dup(root_fd)
    for frame in path[1:]:
        try:
            step = os.open(frame[0], _DIR | os.O_NOFOLLOW, dir_fd=current)
        except OSError:
            os.close(current)
            return None
        os.close(current)
        current = step
    return current


def _set_back(fd: int, mode: int | None) -> None:
    """Give directory ``fd`` its ``mode`` back (None: it kept its own) unless it changed meanwhile."""
    if mode is not None:
        with contextlib.suppress(OSError):
            if stat.S_IMODE(os.fstat(fd).st_mode) == mode | 0o500:
                os.fchmod(fd, mode)


def _process_tree(pids: Sequence[int]) -> list[int]:
    """``pids`` and their descendants alive now (from ``/proc/PID/task/TID/children``)."""
    found, stack = [], list(pids)
    while stack:
        pid = stack.pop()
        found.append(pid)
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    stack += [int(child) for child in f.read().split()]
            except (OSError, ValueError):
                continue
    return found


def _held_files(pid: int, devices: set[int], seen: set[tuple[int, int]]) -> int:
    """The bytes of the deleted files process ``pid`` holds and ``seen`` does not list (added to it):
    open ones (``tempfile.TemporaryFile``, memfd), and mapped ones on ``devices`` (other mappings are
    memory, within the address-space limit). A mapped file's size is read through ``map_files``
    where this process may (root), else taken as the mapping's length."""
    total = 0
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        fds = []
    for fd in fds:
        try:
            st = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 0 and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    try:
        with open(f"/proc/{pid}/maps") as f:
            mapped = [line.split() for line in f if line.endswith(" (deleted)\n")]
    except OSError:
        mapped = []
    for span, _perms, _offset, dev, inode, *_path in mapped:
        try:
            major, minor = (int(x, 16) for x in dev.split(":"))
            key = (os.makedev(major, minor), int(inode))
            start, end = (int(x, 16) for x in span.split("-"))
        except ValueError:
            continue
        if key[0] not in devices or key in seen:
            continue
        seen.add(key)
        try:
            total += os.stat(f"/proc/{pid}/map_files/{span}").st_blocks * 512
        except OSError:
            total += end - start
    return total


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


def over_quota(disk_mb: int) -> str:
    """The words for files past a disk quota."""
    return f"the files in the work dir are past its disk quota of {disk_mb} MB"


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
    tmp = tempfile.mkdtemp(prefix="dsv32-sandbox-") if cwd is None else None
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


def remove_tree(path: str | os.PathLike) -> None:
    """Remove a directory a sandboxed program wrote into, whatever it left there — a tree deeper
    than Python's recursion limit, directories it made unreadable — and never raise: a tree that
    cannot be removed is logged and left."""
    try:
        shutil.rmtree(path)
        return
    except FileNotFoundError:
        return
    except (OSError, RecursionError):
        pass
    # coreutils walk any depth without recursion; chmod first so the owner may empty every directory
    subprocess.run(["chmod", "-R", "u+rwx", "--", str(path)], capture_output=True, check=False)
    done = subprocess.run(["rm", "-rf", "--", str(path)], capture_output=True, check=False)
    if os.path.lexists(path):
        log.warning("sandbox: could not remove %s: %s", path, done.stderr.decode(errors="replace").strip())


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
