"""Disk accounting: what a sandboxed program holds on disk (:func:`disk_usage`).

Everything under the watched paths counts — each file's allocated blocks, each name at least
:data:`ENTRY_BYTES`, a hard-linked file once — and so do the deleted files the program's processes
still hold open or mapped. The tree is walked through directory descriptors, so a tree of any depth
costs the same per name and a program cannot hide files in a directory it made unreadable.
``watch.py`` runs this walk while a program runs and stops the program past its quota.
"""

from __future__ import annotations

import contextlib
import math
import os
import stat
from collections.abc import Sequence

from dsv32.envs.sandbox.view import outermost

DISK_MB = 1024  # the default disk quota of a run's work dir and writable paths
# Every name under a watched directory counts at least this much: the disk a filesystem sets aside
# for one inode (mke2fs's default ratio), so a flood of empty files or links counts, and a tree
# within the quota has at most quota / ENTRY_BYTES names (which bounds the time of one walk).
ENTRY_BYTES = 16 << 10


def over_quota(disk_mb: int) -> str:
    """The words for files past a disk quota."""
    return f"the files in the work dir are past its disk quota of {disk_mb} MB"


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
    for root in outermost([os.path.realpath(p) for p in paths]):
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
