"""Launching a confined program: the argv that starts it under an isolation kind, which kind that is
on this machine, and the host user ids a root launcher hands out.

:func:`command_prefix` puts the confine stage (``python -I -S confine.py SPEC``) in front of a
program, behind ``bwrap`` or ``unshare`` with the filesystem view of ``view.py``; :func:`popen` starts
such a command in a session of its own and :func:`kill` ends its process group. :func:`choose` picks
the kind: the one asked for, ``$DSV32_SANDBOX``, else the strongest of :data:`KINDS` that starts
``true`` here (probed once). When this process is root, the confine stage runs first as a launcher
that takes a host user id of the sandbox's own (:func:`sandbox_uids`, :func:`own_user_ids`).
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
import subprocess
import sys
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from dsv32.envs.base import TASK_FILES, EnvError
from dsv32.envs.sandbox import view
from dsv32.envs.sandbox.leftovers import owned_tempdir, remove_tree
from dsv32.envs.sandbox.view import CONFINE, PYTHON, runtime_paths

log = logging.getLogger(__name__)

KINDS = ("bwrap", "unshare", "rlimits")
BASE_ENV = {
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
    "MALLOC_ARENA_MAX": "2",
}
SHM_MB = 64  # the most a private /dev/shm holds (no more than memory_mb)
UIDS = (2_100_000_000, 65536)  # the host user ids sandboxes started by root run as: (base, count)
NO_ISOLATION = (
    "NO ISOLATION: neither bubblewrap nor unprivileged user namespaces work here; only rlimits "
    "and the process group apply — the program can use the network, write wherever this user can "
    "and signal this user's processes"
)


class SandboxError(EnvError):
    """A sandbox that cannot be set up as asked (an isolation this machine lacks, a bad limit)."""


# ------------------------------------------------------------------------------ sandbox user ids
def sandbox_uids() -> tuple[int, int]:
    """The host user ids a sandbox started by root runs as: ``(base, count)``, from
    ``$DSV32_SANDBOX_UIDS`` (``BASE:COUNT``) or :data:`UIDS`; each sandbox takes one no other
    sandbox holds (see ``confine.py``)."""
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


# ------------------------------------------------------------------------------ the argv of a kind
@cache
def _etc_files() -> dict[str, str]:
    """Host files holding the view's synthetic ``/etc`` files (bubblewrap binds files in)."""
    folder = owned_tempdir("etc")
    os.chmod(folder, 0o755)
    files = {"/etc/passwd": view.PASSWD, "/etc/group": view.GROUP}
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


def view_steps(network: bool, writable: Sequence[str], readable: Sequence[str], tmp_bytes: int) -> list:
    """The view (``view.plan``) of a program started with this process's Python."""
    runtime = [*runtime_paths(), PYTHON]
    masks = [f for f in TASK_FILES if os.path.isfile(f)]
    return view.plan(
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
    prefix when there is one)``. A launcher (``confine.py`` as root, see its doc) runs first when
    this process is root, so the sandbox runs as a user id of its own."""
    if kind == "rlimits":
        return [], {}, []
    steps = view_steps(network, writable, readable, shm_bytes)
    root = own_user_ids()
    pdeath = ["setpriv", "--pdeathsig", "KILL"] if shutil.which("setpriv") else []
    uids = [_uid_lock_dir(), *sandbox_uids()]
    if kind == "bwrap":
        argv = [shutil.which("bwrap") or "bwrap", "--unshare-user", "--uid", "0", "--gid", "0"]
        argv += ["--unshare-pid", "--as-pid-1"]
        argv += ["--unshare-ipc", "--unshare-uts"] + ([] if network else ["--unshare-net"])
        argv += ["--die-with-parent"] + (["--disable-userns"] if bwrap_has("--disable-userns") else [])
        argv += view.bwrap_args(steps, _etc_files(), _bwrap_sizes_tmpfs())
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


def bwrap_has(option: str) -> bool:
    """Whether this machine's bubblewrap takes ``option``."""
    return option in _bwrap_help()


def _bwrap_sizes_tmpfs() -> bool:
    """Whether this machine's bubblewrap takes ``--size`` before ``--tmpfs`` (0.10 and later)."""
    return bwrap_has("--size")


# ---------------------------------------------------------------------------- which kind works here
@cache
def _works(kind: str) -> bool:
    """Whether ``kind`` starts ``true`` confined on this machine (asked once per kind)."""
    if kind == "rlimits":
        return True
    if shutil.which(kind) is None:
        return False
    tmp = owned_tempdir("probe")
    try:
        argv = [*command_prefix(cwd=tmp, memory_mb=256, timeout_s=10, kind=kind), "true"]
        try:
            done = subprocess.run(argv, capture_output=True, timeout=20, env={"PATH": os.defpath})
        except (OSError, subprocess.TimeoutExpired):
            return False
    finally:
        remove_tree(tmp)
    if done.returncode != 0:
        log.info("sandbox: %s does not work here: %s", kind, done.stderr.decode(errors="replace").strip())
    return done.returncode == 0


def choose(kind: str | None = None) -> str:
    """The isolation kind a sandbox gets: ``kind`` if given (an error if it does not work here), else
    ``$DSV32_SANDBOX`` if set, else the strongest that works (bwrap, unshare, rlimits)."""
    kind = kind or os.environ.get("DSV32_SANDBOX") or None
    if kind is not None and kind not in KINDS:
        raise SandboxError(f"unknown sandbox isolation {kind!r}; choose one of {', '.join(KINDS)}")
    if kind is not None and not _works(kind):
        raise SandboxError(f"sandbox isolation {kind!r} does not work on this machine; {_hint(kind)}")
    chosen = kind or next(k for k in KINDS if _works(k))
    if chosen == "rlimits" and kind is None:  # the fallback, not a caller's or $DSV32_SANDBOX's choice
        _warn_once()
    return chosen


def _hint(kind: str) -> str:
    if kind == "bwrap":
        return "install bubblewrap (apt-get install bubblewrap) or use 'unshare'"
    return "the kernel must allow unprivileged user namespaces (sysctl user.max_user_namespaces > 0)"


@cache
def _warn_once() -> None:
    log.warning("sandbox: %s", NO_ISOLATION)


# --------------------------------------------------------------------------- starting the program
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
    the view's allowlist (see ``view.py``), read-only, as do absolute ``PYTHONPATH`` entries of
    ``env``."""
    if memory_mb <= 0 or timeout_s <= 0 or processes <= 0 or open_files <= 0 or file_size_mb <= 0:
        raise SandboxError("sandbox limits must be positive (memory_mb, timeout_s, processes, files)")
    if kind not in KINDS:
        kind = choose(kind)
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
