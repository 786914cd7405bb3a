"""The temporary directories sandboxes leave behind when their process is killed, and their removal.

A process removes the directories it makes for sandboxes — work dirs (``dsv32-sandbox-*``), the
Jupyter kernel's (``dsv32-kernel-*``, ``dsv32-kernel-run-*``), the view's ``/etc`` files
(``dsv32-etc-*``), the probe's (``dsv32-probe-*``) — when it is done with them or at exit; a process
killed by SIGKILL (a Ray actor, an OOM kill) removes nothing. So each such directory carries its
owner in its name, made by :func:`owned_tempdir`: ``dsv32-sandbox-<pid>.<start>-<n>``, the owning
process's id and its start time (``/proc/<pid>/stat``, clock ticks since boot; a pid reused by a
later process has another start time), both in base 36, and a counter of the process's directories
(made with an exclusive ``mkdir``, so a name someone else took is skipped). The name, not a file
inside, because a sandboxed program can write in its own work dir but cannot rename it; short,
because a kernel's sockets live in its run dir and a socket's path holds at most 107 bytes.

:func:`sweep_leftovers` removes the directories in the temp dir whose owner is gone and never one
whose owner lives (nor one whose owner it cannot tell: a name without an owner, a system without
``/proc``, another user's directory). It runs once per process, before the first such directory is
made (:func:`owned_tempdir`), and whenever a caller knows owners died (a Ray runner that killed its
actors).
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

log = logging.getLogger(__name__)

#: The kinds of directory an owner tag is given (the prefix before ``<pid>.<start>-``).
KINDS = ("sandbox", "kernel-run", "kernel", "etc", "probe")
_NAME = re.compile(rf"^dsv32-({'|'.join(KINDS)})-([0-9a-z]+)\.([0-9a-z]+)-")
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"

_swept = False
_sweeping = threading.Lock()
_made = itertools.count()


def start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, ``/proc/<pid>/stat`` field 22); None
    when there is no such process, it has exited (a zombie not yet reaped) or there is no ``/proc``."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):  # fields[0] is field 3, the state: exited
        return None
    return int(fields[19])  # field 22


def _b36(n: int) -> str:
    out = ""
    while True:
        n, digit = divmod(n, 36)
        out = _DIGITS[digit] + out
        if not n:
            return out


def owner_tag(pid: int | None = None, start: int | None = None) -> str:
    """``<pid>.<start time>`` in base 36, of ``pid`` (default: this process) and ``start`` (default:
    its own, 0 where it cannot be read)."""
    pid = pid or os.getpid()
    start = start_time(pid) or 0 if start is None else start
    return f"{_b36(pid)}.{_b36(start)}"


def owner(name: str) -> tuple[int, int] | None:
    """``(pid, start time)`` of the process that made the directory called ``name``; None for a
    name without an owner."""
    match = _NAME.match(name)
    return None if match is None else (int(match.group(2), 36), int(match.group(3), 36))


def owned_tempdir(kind: str) -> str:
    """A fresh directory ``dsv32-<kind>-<pid>.<start>-<n>`` in the temp dir, owned by this process
    (mode 0700, as :func:`tempfile.mkdtemp`); the first one a process makes sweeps the leftovers of
    dead owners first."""
    if kind not in KINDS:
        raise ValueError(f"unknown sandbox directory kind {kind!r}; known: {', '.join(KINDS)}")
    sweep_once()
    prefix = os.path.join(tempfile.gettempdir(), f"dsv32-{kind}-{owner_tag()}-")
    for _ in range(100):
        path = prefix + _b36(next(_made))
        try:
            os.mkdir(path, 0o700)  # exclusive: an existing name (or link) is never used
            return path
        except FileExistsError:
            continue
    return tempfile.mkdtemp(prefix=os.path.basename(prefix))  # the names were taken: a random one


def owner_alive(pid: int, start: int) -> bool:
    """Whether the process that made a directory tagged ``<pid>.<start>`` still runs (a tag made
    where the start time could not be read, 0, trusts the pid alone)."""
    now = start_time(pid)
    return now is not None and (start == 0 or now == start)


def leftovers(directory: str | os.PathLike | None = None) -> list[Path]:
    """The directories in ``directory`` (default: the temp dir) whose owner is gone and that this
    user may remove (its own; root: any)."""
    if not Path("/proc/self/stat").exists():  # no way to tell an owner alive: remove nothing
        return []
    root = Path(directory or tempfile.gettempdir())
    euid = os.geteuid()
    out = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    for entry in entries:
        made_by = owner(entry.name)
        if made_by is None:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not entry.is_dir(follow_symlinks=False) or not _may_remove(st.st_uid, euid):
            continue
        if not owner_alive(*made_by):
            out.append(Path(entry.path))
    return out


def _may_remove(uid: int, euid: int) -> bool:
    return uid == euid or euid == 0  # root: also the work dirs it handed to sandbox user ids


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


def sweep_leftovers(directory: str | os.PathLike | None = None) -> list[Path]:
    """Remove :func:`leftovers`; returns what was removed."""
    removed = []
    for path in leftovers(directory):
        remove_tree(path)
        if not os.path.lexists(path):
            removed.append(path)
    if removed:
        log.info("sandbox: removed %d directories left by processes that are gone", len(removed))
    return removed


def sweep_once() -> None:
    """:func:`sweep_leftovers` the first time it is called in this process; later calls return."""
    global _swept
    if _swept:
        return
    with _sweeping:
        if not _swept:
            try:
                sweep_leftovers()
            finally:
                _swept = True
