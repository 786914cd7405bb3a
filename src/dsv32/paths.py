"""Where dsv32 keeps what it builds or converts once and reuses: ``$DSV32_CACHE_DIR``, else
``$XDG_CACHE_HOME/dsv32``, else ``~/.cache/dsv32``. This module imports nothing of ours."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """The cache root, or a folder under it (not created here)."""
    root = os.environ.get("DSV32_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dsv32"
    )
    return Path(root, *parts)
