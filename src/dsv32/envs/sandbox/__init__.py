"""The one way ``dsv32.envs`` runs model-written code: a confined child process.

``run(argv, timeout_s=..., memory_mb=...)`` starts ``argv`` in its own session (process group) and
working directory, under three layers, the strongest this machine allows (probed once, see
:func:`isolation`):

- ``bwrap`` (bubblewrap installed): new user, PID, IPC, UTS (and, unless ``network=True``, network)
  namespaces, the filesystem view below, no nested user namespaces (``--disable-userns``, where
  this bubblewrap has it), every capability dropped.
- ``unshare`` (user namespaces work): the same namespaces; ``confine.py`` builds the same view
  (from an empty tmpfs, then ``pivot_root``), sets ``user.max_user_namespaces`` to 0 in the
  sandbox's user namespace and drops every capability (so the program cannot remount anything).
- ``rlimits`` (neither works): resource limits and the process group only — the network, the host
  filesystem and the other processes of the host user are reachable; a warning says so.

The filesystem view (``view.py``) is an allowlist: an empty root into which only what the program
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
(``confine.py``) runs each sandbox as a host user id of its own (:func:`sandbox_uids`: one of
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

The files, in the order they build on each other:

- ``view.py``: the filesystem view (the allowlist plan, its bubblewrap options) and what of this
  Python it shows (:func:`runtime_paths`, :func:`project_dirs`);
- ``confine.py``: the confine stage and root's launcher, run as a script inside the sandbox
  (standard library only, bound in alone);
- ``launch.py``: the argv prefix of each kind (:func:`command_prefix`), the choice of kind, the
  sandbox user ids, :func:`popen` and :func:`kill`;
- ``isolation.py``: :func:`isolation`, what applies here in words;
- ``disk.py``: :func:`disk_usage`, the walk of a tree and the deleted files a program holds;
- ``watch.py``: :class:`DiskWatch` and the one thread that polls every watch;
- ``leftovers.py``: the temporary directories sandboxes use, each named after its owning process
  (:func:`owned_tempdir`: pid and start time), :func:`remove_tree`, and :func:`sweep_leftovers`, which
  removes those whose owner is gone (killed outright, so it removed nothing) and never one whose
  owner lives — once per process before its first such directory, and when a Ray runner killed its
  actors;
- ``run.py``: :func:`run` (input, capped output, the limits, :class:`SandboxResult`).
"""

from dsv32.envs.sandbox.disk import DISK_MB, ENTRY_BYTES, disk_usage, over_quota
from dsv32.envs.sandbox.isolation import Isolation, isolation, process_bound
from dsv32.envs.sandbox.launch import (
    BASE_ENV,
    KINDS,
    SHM_MB,
    UIDS,
    SandboxError,
    choose,
    command_prefix,
    kill,
    own_user_ids,
    popen,
    release,
    sandbox_uids,
)

# benchmarks/envs.py and tests/rl reach these two private names through the package
from dsv32.envs.sandbox.launch import _etc_files as _etc_files
from dsv32.envs.sandbox.launch import _works as _works
from dsv32.envs.sandbox.leftovers import owned_tempdir, remove_tree, sweep_leftovers
from dsv32.envs.sandbox.run import SandboxResult, run
from dsv32.envs.sandbox.view import CONFINE, PYTHON, project_dirs, runtime_paths
from dsv32.envs.sandbox.watch import DiskWatch

__all__ = [
    "BASE_ENV",
    "CONFINE",
    "DISK_MB",
    "ENTRY_BYTES",
    "KINDS",
    "PYTHON",
    "SHM_MB",
    "UIDS",
    "DiskWatch",
    "Isolation",
    "SandboxError",
    "SandboxResult",
    "choose",
    "command_prefix",
    "disk_usage",
    "isolation",
    "kill",
    "over_quota",
    "own_user_ids",
    "owned_tempdir",
    "popen",
    "process_bound",
    "project_dirs",
    "release",
    "remove_tree",
    "run",
    "runtime_paths",
    "sandbox_uids",
    "sweep_leftovers",
]
