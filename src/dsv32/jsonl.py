"""JSONL files of user data (tasks, corpora, conversations, benchmark rows): one reader, so every
one of them skips blank lines and reports a bad line the same way, as ``FILE:LINE: not JSON (why)``
raised as the caller's own error class."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def read_jsonl(path: str | Path, error: type[Exception]) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` for every non-blank line of ``path`` (callers name a line as
    ``f"{path}:{n}"`` in their own messages). A line that is not JSON — or that the parser cannot hold (a number of
    thousands of digits, arrays nested past the recursion limit) — raises ``error``. Opening the file
    raises ``OSError`` as usual."""
    with Path(path).open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as err:
                raise error(f"{path}:{n}: not JSON ({err.msg})") from err
            except (ValueError, RecursionError) as err:
                raise error(f"{path}:{n}: not JSON ({type(err).__name__}: {err})") from err
            yield n, value
