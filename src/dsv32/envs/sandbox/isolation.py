"""What confines a sandboxed program on this machine, in words a user can check: :func:`isolation`
names the kind (``launch.choose``), the host paths its view shows and what bounds its processes."""

from __future__ import annotations

import os
from dataclasses import dataclass

from dsv32.envs.sandbox import view
from dsv32.envs.sandbox.launch import NO_ISOLATION, bwrap_has, choose, own_user_ids, sandbox_uids, view_steps


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
    "rlimits": NO_ISOLATION,
}


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


def isolation(kind: str | None = None) -> Isolation:
    """The isolation a sandbox gets: ``kind`` if given (an error if it does not work here), else
    ``$DSV32_SANDBOX`` if set, else the strongest that works (bwrap, unshare, rlimits)."""
    chosen = choose(kind)
    confined = chosen != "rlimits"
    shown = view.visible(view_steps(False, [], [], 1 << 20)) if confined else ()
    note = _NOTES[chosen]
    if chosen == "bwrap" and not bwrap_has("--disable-userns"):
        note = note.replace(
            "no nested user namespaces", "nested user namespaces allowed (no --disable-userns)"
        )
    return Isolation(chosen, confined, confined, confined, note, shown, process_bound(chosen))
