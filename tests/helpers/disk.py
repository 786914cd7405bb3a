"""What the disk-quota tests of the sandbox and the interpreter share."""

from __future__ import annotations

import os

# a program that writes 512 files just under 1 MiB each (past a small quota), then waits
FILL = (
    "import time\nfor i in range(512):\n    open(f'f{i}', 'wb').write(b'x' * ((1 << 20) - 1))\ntime.sleep(60)"
)


def allocated(root: str | os.PathLike) -> int:
    """The bytes allocated under ``root`` (what ``du`` counts), read here, apart from the sandbox."""
    return sum(
        os.lstat(os.path.join(top, name)).st_blocks * 512
        for top, dirs, files in os.walk(root)
        for name in dirs + files
    )
