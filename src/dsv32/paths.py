"""Where dsv32 keeps what it builds or converts once and reuses: ``$DSV32_CACHE_DIR``, else
``$XDG_CACHE_HOME/dsv32``, else ``~/.cache/dsv32``; and the lock a run holds on its output
directory. This module imports nothing of ours."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO


def cache_dir(*parts: str) -> Path:
    """The cache root, or a folder under it (not created here)."""
    root = os.environ.get("DSV32_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dsv32"
    )
    return Path(root, *parts)


def lock_directory(path: Path) -> IO[str] | None:
    """The open ``path/.lock``, locked exclusively, or None at once when another process holds it.
    The lock belongs to the open file: closing it releases the lock, and the system drops it when
    the process ends, however it ends, so a killed run never leaves the directory locked."""
    handle = (path / ".lock").open("a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle
