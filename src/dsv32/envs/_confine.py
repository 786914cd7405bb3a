"""The last stage before a sandboxed program runs: ``python -I -S _confine.py SPEC_JSON ARGV...``.

It runs inside the namespaces the sandbox made (``unshare`` or ``bwrap``) and, in this order:

1. with ``"mounts": true`` (the ``unshare`` isolation, which has no bwrap to do it): runs the
   ``"steps"`` in order, outer paths first: an empty tmpfs over each hidden directory (the host
   user's home, the project's source) and each exposed path in it bound back, from a file
   descriptor opened before any tmpfs hid it; binds ``/dev/null`` over each ``"masks"`` file (the
   task files the host read); bind-mounts each writable directory
   onto itself, then remounts every other mount point read-only (keeping the flags the kernel locks:
   nosuid, nodev, noexec, atime) — the whole filesystem but the work dir is read-only; then, with
   ``"shm_bytes"``, mounts a fresh tmpfs of that size on ``/dev/shm`` (POSIX shared memory and
   semaphores, which ``multiprocessing`` needs; its size bounds the memory it holds), in place of
   the host's (where that mount fails, the host's stays, read-only);
2. drops every capability from the bounding set and sets the no-new-privileges bit and the
   ``NOROOT`` secure bits, so the program (uid 0 inside its user namespace) cannot remount, mount or
   regain a capability through ``execve``;
3. (in the program's process) sets the resource limits (``setrlimit``: CPU, address space, processes, open files, file size)
   — inside the user namespace, so the process count is the sandbox's own, not the host user's;
4. forks; the child changes to the working directory and ``execvpe``s the program with exactly the
   given environment; this process stays as the PID namespace's init, reaps orphans, and reports
   the program's end on the status fd (``exit N`` / ``signal N``).

Any failure exits with code 126 and a one-line reason on stderr (the sandbox never runs a program
half-confined). Standard library only, no imports of ``dsv32``: it starts with ``-I -S`` in ~20 ms.
"""

import ctypes
import json
import os
import resource
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_RELATIME, MS_STRICTATIME = 16384, 1 << 21, 1 << 24
# statvfs f_flag bit -> mount(2) flag, for the flags a less privileged mount namespace must keep.
_LOCKED = {
    os.ST_NOSUID: MS_NOSUID,
    os.ST_NODEV: MS_NODEV,
    os.ST_NOEXEC: MS_NOEXEC,
    os.ST_NOATIME: MS_NOATIME,
    os.ST_NODIRATIME: MS_NODIRATIME,
    os.ST_RELATIME: MS_RELATIME,
}
PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_SET_NO_NEW_PRIVS = 4, 24, 28, 38
SECBIT_ALL_LOCKED_NOROOT = 0x2F  # NOROOT, NO_SETUID_FIXUP and their locks; KEEP_CAPS off

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


class ConfineError(Exception):
    pass


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise ConfineError(f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, flags: int) -> None:
    src = source.encode() if source is not None else None
    _check(_libc.mount(src, target.encode(), None, flags, None), f"mount {target}")


def _unescape(field: bytes) -> str:
    """A mountinfo path: the kernel writes space, tab, newline and backslash as 3-digit octal
    escapes and every other byte as is (UTF-8 or not), so undo the escapes on the bytes."""
    parts = field.split(b"\\")
    raw = parts[0] + b"".join(bytes([int(p[:3], 8)]) + p[3:] for p in parts[1:])
    return os.fsdecode(raw)


def _mount_points() -> list[str]:
    """Every mount point of this namespace (field 5 of mountinfo)."""
    with open("/proc/self/mountinfo", "rb") as f:
        points = [_unescape(line.split()[4]) for line in f]
    return list(dict.fromkeys(points))


def hide(steps: list[list[str]]) -> None:
    """``steps`` in order (outer paths first): ``["hide", dir]`` mounts an empty tmpfs over ``dir``,
    ``["expose", path]`` binds the host's ``path`` back (a hidden directory may lie in an exposed
    one, and an exposed path in that hidden directory)."""
    # the host's paths, opened before any tmpfs hides them
    held = {path: os.open(path, os.O_PATH) for step, path in steps if step == "expose"}
    for step, path in steps:
        if step == "hide":
            os.makedirs(path, exist_ok=True)
            _check(
                _libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0555"),
                f"hide {path}",
            )
            continue
        fd = held[path]
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(path, exist_ok=True)
        else:  # a file: its parent directories and an empty file to mount it on
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if not os.path.exists(path):
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o444))
        _mount(f"/proc/self/fd/{fd}", path, MS_BIND | MS_REC)
        os.close(fd)


def read_only_except(writable: list[str]) -> None:
    """Bind each writable dir onto itself, then remount every other mount point read-only."""
    for path in writable:
        _mount(path, path, MS_BIND | MS_REC)
    keep = {os.path.realpath(p) for p in writable} | {"/proc"}
    for point in _mount_points():
        if point in keep or point.startswith("/proc/"):
            continue
        try:
            flags = os.statvfs(point).f_flag
        except OSError:  # a mount point hidden by another mount: nothing can reach it
            continue
        if flags & os.ST_RDONLY:
            continue
        locked = sum(ms for st, ms in _LOCKED.items() if flags & st)
        _mount(None, point, MS_BIND | MS_REMOUNT | MS_RDONLY | locked)


def private_shm(size: int) -> None:
    """A fresh tmpfs of ``size`` bytes (and one inode per 16 KiB of it) on ``/dev/shm``, if there is
    one; a mount that fails leaves the host's, read-only."""
    if not os.path.isdir("/dev/shm"):
        return
    options = f"mode=1777,size={size},nr_inodes={max(size >> 14, 64)}".encode()
    _libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV, options)


def drop_privileges() -> None:
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
    _check(_libc.prctl(PR_SET_SECUREBITS, SECBIT_ALL_LOCKED_NOROOT, 0, 0, 0), "set securebits")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "set no_new_privs")


def set_limits(limits: dict[str, list[int]]) -> None:
    """``{"RLIMIT_CPU": [soft, hard], ...}``; -1 is unlimited."""
    for name, (soft, hard) in limits.items():
        resource.setrlimit(getattr(resource, name), (soft, hard))


def _program(spec: dict, program: list[str]) -> None:
    """The forked child: limits, work dir, exec (never returns)."""
    try:
        set_limits(spec["limits"])
        os.chdir(spec["cwd"])
        os.execvpe(program[0], program, spec["env"])
    except (OSError, ValueError) as err:
        sys.stderr.write(f"sandbox: cannot run {program[0]!r}: {err}\n")
        os._exit(127 if isinstance(err, FileNotFoundError) else 126)


def main(argv: list[str]) -> None:
    """Confine, fork the program, reap every orphan until it exits (this process is the PID
    namespace's init), write ``exit N`` or ``signal N`` to the status fd and exit with the program's
    code (``128 + N`` for a signal)."""
    spec = json.loads(argv[1])
    program = argv[2:]
    status_fd = spec.get("status_fd")
    try:
        if spec.get("mounts"):
            hide(spec.get("steps", []))
            read_only_except(spec["writable"])
            for path in spec.get("masks", []):  # a task file: read as empty
                _mount("/dev/null", path, MS_BIND)
            if spec.get("shm_bytes"):
                private_shm(spec["shm_bytes"])
        if spec.get("drop_privileges"):
            drop_privileges()
    except (ConfineError, OSError, ValueError) as err:
        sys.stderr.write(f"sandbox: could not confine the program: {err}\n")
        sys.exit(126)
    # not dumpable: the program (same uid, no capabilities) cannot open this process's files through
    # /proc/1/fd (the status fd) nor ptrace it; the program's own execve makes it dumpable again
    _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "clear dumpable")
    child = os.fork()
    if child == 0:
        if status_fd is not None:
            os.close(status_fd)
        _program(spec, program)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            sys.exit(126)
        if pid == child:
            break
    signum = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
    code = os.WEXITSTATUS(status) if not signum else 128 + signum
    if status_fd is not None:
        os.write(status_fd, (f"signal {signum}" if signum else f"exit {code}").encode())
    sys.exit(code)


if __name__ == "__main__":
    main(sys.argv)
