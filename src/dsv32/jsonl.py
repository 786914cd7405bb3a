"""JSONL files: one reader for user data (tasks, corpora, conversations, benchmark rows) and one for
the append-only logs a run resumes from (evaluation samples, synthesis results). Both skip blank
lines and report a bad line the same way, as ``FILE:LINE: not JSON (why)`` raised as the caller's
own error class."""

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


def read_log(path: str | Path, error: type[Exception], hint: str) -> list[Any]:
    """The rows of an append-only JSONL log (``[]`` when there is none yet). Every row ends with
    ``\n``, and lines are split on ``\n`` only (a row may hold U+2028 and the like): whatever follows
    the last ``\n`` is an interrupted write, cut off the file so the next row starts on a line of its
    own (the run redoes that row). A bad complete line raises ``error`` ending in ``hint``."""
    path = Path(path)
    if not path.is_file():
        return []
    data = path.read_bytes()
    *lines, tail = data.split(b"\n")
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise error(f"{path}:{n}: not JSON ({getattr(err, 'msg', err)}); {hint}") from err
    if tail:
        with path.open("r+b") as f:
            f.truncate(len(data) - len(tail))
    return rows
