"""The filesystem a sandboxed program sees: an allowlist, built from an empty root.

:func:`plan` lists the steps that build it, in order, as ``[op, path, arg]`` lists; ``confine.py``
carries them out under ``unshare`` and :func:`bwrap_args` turns them into bubblewrap options, so
both isolations show the same view:

- ``/usr``, ``/bin``, ``/sbin``, ``/lib*`` (symlinks where the host has symlinks), read-only;
- ``/etc`` but its secrets (:data:`ETC_SECRETS`: ``shadow``, ``gshadow``, ssh host keys, sudoers,
  subordinate id ranges, private TLS keys) with a synthetic ``passwd`` and ``group`` naming only the
  sandbox's users, read-only;
- the Python a program is started with: its installation, its interpreter's directory and the
  import path it starts with, but nothing of this project's source (:func:`runtime_paths`,
  :func:`project_dirs`), plus the ``readable`` paths a caller names, read-only; symlinks on the way
  to them kept as symlinks;
- the work dir and ``writable`` paths, read-write;
- a fresh ``/proc``; a minimal ``/dev`` (``null``, ``zero``, ``full``, ``random``, ``urandom``,
  ``tty``, the ``fd`` links) with a private ``/dev/shm``; a private ``/tmp``.

Nothing else exists inside: not the home, ``/root``, ``/var``, ``/srv``, ``/opt``, ``/mnt``,
``/run``, the cache directory, any run's output directory, nor the host's sockets there. A task file
the host read (``base.TASK_FILES``) that lies in a visible path has ``/dev/null`` bound over it.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
from collections.abc import Sequence
from functools import cache
from pathlib import Path

log = logging.getLogger(__name__)

# The confine stage: the one file of this package a sandbox runs (see confine.py), bound in alone.
CONFINE = str(Path(__file__).with_name("confine.py"))
# This Python by a normalised path: the one to run inside a sandbox. ``sys.executable`` keeps the path
# the interpreter was started by (``benchmarks/../.venv/bin/python``), and such a path need not exist
# in the sandbox's view, which holds real paths only; ``launch.popen`` and ``run.run`` replace it.
PYTHON = os.path.abspath(sys.executable)
EXPAND_MAX = 4096  # the most entries of private directories shown one by one, in one view
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Entries of /etc that stay out of the view: password hashes, host keys, privilege rules, id ranges.
ETC_SECRETS = frozenset(
    {
        "shadow", "shadow-", "gshadow", "gshadow-", "passwd", "passwd-", "group", "group-",
        "ssh", "sudoers", "sudoers.d", "subuid", "subuid-", "subgid", "subgid-", ".pwd.lock",
        "security", "krb5.keytab", "machine-id", "credstore", "credstore.encrypted",
    }
)  # fmt: skip

PASSWD = "root:x:0:0:root:/nonexistent:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
GROUP = "root:x:0:\nnogroup:x:65534:\n"  # the program is uid 0 in its namespace (no capabilities)


def under(path: str, roots: Sequence[str]) -> bool:
    """Whether ``path`` is one of ``roots`` or lies inside one."""
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def outermost(paths: Sequence[str]) -> list[str]:
    """``paths`` without those inside another one of them (binding the outer one binds them)."""
    kept: list[str] = []
    for p in sorted(set(paths), key=len):
        if not under(p, kept):
            kept.append(p)
    return kept


def _chain(path: str, links: dict[str, str], depth: int = 0) -> str | None:
    """The real path of ``path``, recording in ``links`` each symlink met on the way (its path ->
    its target as written), so the view can hold the same links; None past 40 links."""
    if depth > 40:
        return None
    parts = [p for p in path.split("/") if p]
    current = "/"
    for i, part in enumerate(parts):
        step = os.path.join(current, part)
        if os.path.islink(step):
            target = os.readlink(step)
            links[step] = target
            rest = "/".join(parts[i + 1 :])
            resolved = os.path.normpath(os.path.join(current, target))
            return _chain(os.path.join(resolved, rest) if rest else resolved, links, depth + 1)
        current = step
    return current


def plan(
    *,
    runtime: Sequence[str],
    readable: Sequence[str],
    writable: Sequence[str],
    masks: Sequence[str] = (),
    network: bool = False,
    tmp_bytes: int,
    private: bool = False,
) -> list[list]:
    """The steps that build the view (see the module doc). ``runtime`` and ``readable`` are shown
    read-only, ``writable`` read-write (each a path as the caller names it: symlinks on the way are
    kept), ``masks`` are files read as empty; ``tmp_bytes`` bounds the private ``/tmp`` and
    ``/dev/shm``; with ``private`` (the program runs as a user id of its own, not the owner of the
    host's files) a read-only directory only its owner may enter is shown by its entries
    (:func:`_expand`). Ops: ``ro``/``rw`` (bind), ``dir`` (an empty directory), ``symlink`` (arg:
    target), ``file`` (arg: content), ``tmpfs`` (arg: size in bytes), ``proc``, ``dev`` (arg: the
    size of ``/dev/shm``), ``mask``."""
    links: dict[str, str] = {}
    steps: list[list] = []
    for path in SYSTEM:
        if os.path.islink(path):
            links[path] = os.readlink(path)
        elif os.path.isdir(path):
            steps.append(["ro", path, None])
    etc: list[list] = []
    if os.path.isdir("/etc"):
        for name in sorted(os.listdir("/etc")):
            path = os.path.join("/etc", name)
            if name in ETC_SECRETS:
                continue
            if os.path.islink(path):
                etc.append(["symlink", path, os.readlink(path)])
            elif os.path.isdir(path) or os.path.isfile(path):
                etc.append(["ro", path, None])
        etc.append(["file", "/etc/passwd", PASSWD])
        etc.append(["file", "/etc/group", GROUP])
        if os.path.isdir("/etc/ssl/private"):
            etc.append(["tmpfs", "/etc/ssl/private", 0])
        if network and os.path.islink("/etc/resolv.conf"):  # (often a file under /run)
            target = os.path.realpath("/etc/resolv.conf")
            if os.path.isfile(target):
                readable = [*readable, target]
    shown = {"ro": [], "rw": []}
    for op, paths in (("ro", [*runtime, *readable]), ("rw", writable)):
        for path in paths:
            real = _chain(os.path.abspath(path), links)
            if real is not None and os.path.exists(real):
                shown[op].append(real)
    system = [s[1] for s in steps] + ["/etc"]
    rw = outermost(shown["rw"])
    ro = [p for p in outermost(shown["ro"]) if not under(p, rw) and not under(p, system)]
    # a read-only path inside a writable one is already there; a writable one in a read-only one is
    # mounted after it (parents first)
    budget = [EXPAND_MAX]
    binds = [step for p in ro for step in (_expand(p, budget) if private else [["ro", p, None]])]
    binds += [["rw", p, None] for p in rw]
    binds.sort(key=lambda s: (s[1].count("/"), s[1]))
    steps += etc
    # the private /tmp before the links and binds: a work dir under the host's /tmp is bound into it
    steps += [["proc", "/proc", None], ["dev", "/dev", tmp_bytes], ["tmpfs", "/tmp", tmp_bytes]]
    for path, target in sorted(links.items(), key=lambda item: item[0].count("/")):
        if not under(path, [*system, *ro, *rw]):
            steps.append(["symlink", path, target])
    steps += binds
    visible = [*system, *ro, *rw]
    steps += [["mask", m, None] for m in sorted(masks) if under(m, visible)]
    return steps


def _expand(path: str, budget: list[int]) -> list[list]:
    """The steps that show ``path`` read-only to a user who is neither its owner nor in its group:
    a directory such a user may not list or enter (``mkdtemp``'s 0700) becomes a directory of the
    view holding its entries, each shown the same way, so what they hold reads as their own modes
    say; at most ``budget[0]`` entries in all are expanded (past it the rest are bound as they are)."""
    try:
        info = os.stat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_mode & 0o005 == 0o005 or budget[0] <= 0:
            return [["ro", path, None]]
        names = sorted(os.listdir(path))
    except OSError:
        return [["ro", path, None]]
    budget[0] -= len(names)
    steps = [["dir", path, None]]
    for name in names:
        child = os.path.join(path, name)
        steps += [["symlink", child, os.readlink(child)]] if os.path.islink(child) else _expand(child, budget)
    return steps


def visible(steps: Sequence[Sequence]) -> tuple[str, ...]:
    """The host paths a view shows (binds and system directories), in order."""
    return tuple(s[1] for s in steps if s[0] in ("ro", "rw"))


def bwrap_args(steps: Sequence[Sequence], files: dict[str, str], sizes_tmpfs: bool) -> list[str]:
    """bubblewrap options that build the view of ``steps``; ``files`` maps each synthetic file's
    path to a host file holding its content (bubblewrap binds files, it does not write them).
    Without ``--size`` (bubblewrap before 0.10) a tmpfs cannot be bounded: ``/tmp`` and
    ``/dev/shm`` are then empty read-only directories."""
    argv: list[str] = []
    for op, path, arg in steps:
        if op == "ro":
            argv += ["--ro-bind", path, path]
        elif op == "dir":
            argv += ["--dir", path]
        elif op == "rw":
            argv += ["--bind", path, path]
        elif op == "symlink":
            argv += ["--symlink", arg, path]
        elif op == "file":
            argv += ["--ro-bind", files[path], path]
        elif op == "tmpfs" and arg == 0:
            argv += ["--perms", "0555", "--tmpfs", path, "--remount-ro", path]
        elif op == "tmpfs":
            argv += (
                ["--perms", "1777", "--size", str(arg), "--tmpfs", path] if sizes_tmpfs else ["--dir", path]
            )
        elif op == "proc":
            argv += ["--proc", path]
        elif op == "dev":
            argv += ["--dev", path]
            if sizes_tmpfs:
                argv += ["--perms", "1777", "--size", str(arg), "--tmpfs", "/dev/shm"]
            argv += ["--remount-ro", path]
        elif op == "mask":
            argv += ["--ro-bind", "/dev/null", path]
    return argv


# ------------------------------------------------------------------- this Python, as the view shows it
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
    packages = [str(Path(__file__).resolve().parents[2])]
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
    return tuple(outermost(found))


def _project_source(path: str) -> bool:
    """Whether ``path`` is inside the project's source (:func:`project_dirs`) and not a Python
    installation there (a virtual environment in the checkout is one)."""
    if not under(path, project_dirs()):
        return False
    return not any(under(path, [p]) for p in _installations() if under(p, project_dirs()))


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
