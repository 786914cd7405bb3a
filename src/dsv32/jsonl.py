"""JSONL files: one reader for user data (tasks, corpora, conversations, benchmark rows) and one for
the append-only logs a run resumes from (evaluation samples, synthesis results, training metrics).
Both split lines on ``\n`` only, skip blank lines and report a bad line (not UTF-8, not JSON) the same
way, as ``FILE:LINE: not JSON (why)`` raised as the caller's own error class. :func:`read_json` reads
one JSON document (a run's settings or state) and names the file the same way."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _row(line: bytes, path: str | Path, n: int, error: type[Exception], hint: str = "") -> Any:
    """Line ``n`` of ``path`` as JSON; a line that is not UTF-8 or not JSON — or that the parser cannot
    hold (a number of thousands of digits, arrays nested past the recursion limit) — raises ``error``."""
    try:
        return json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        why = err.msg if isinstance(err, json.JSONDecodeError) else f"{type(err).__name__}: {err}"
        raise error(f"{path}:{n}: not JSON ({why}){hint}") from err


def read_jsonl(path: str | Path, error: type[Exception]) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` for every non-blank line of ``path`` (callers name a line as
    ``f"{path}:{n}"`` in their own messages); a bad line raises ``error`` (:func:`_row`). Opening the
    file raises ``OSError`` as usual."""
    with Path(path).open("rb") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                yield n, _row(line, path, n, error)


def peek_log(path: str | Path, error: type[Exception], hint: str) -> tuple[list[tuple[int, Any]], int]:
    """``(line number, row)`` for every complete row of an append-only JSONL log (``[]`` when there is
    none yet) and the length in bytes of what follows the last ``\n`` (an interrupted write); reads
    only. A bad complete line raises ``error`` ending in ``hint``."""
    path = Path(path)
    if not path.is_file():
        return [], 0
    *lines, tail = path.read_bytes().split(b"\n")
    rows = [(n, _row(line, path, n, error, f"; {hint}")) for n, line in enumerate(lines, 1) if line.strip()]
    return rows, len(tail)


def read_log(path: str | Path, error: type[Exception], hint: str, *, cut: bool = True) -> list[Any]:
    """The rows of an append-only JSONL log (``[]`` when there is none yet). Every row ends with
    ``\n``, and lines are split on ``\n`` only (a row may hold U+2028 and the like): whatever follows
    the last ``\n`` is an interrupted write, cut off the file so the next row starts on a line of its
    own (the run redoes that row); ``cut=False`` only reads, leaving it out. A bad complete line
    raises ``error`` ending in ``hint``."""
    rows, torn = peek_log(path, error, hint)
    if torn and cut:
        with Path(path).open("r+b") as f:
            f.truncate(f.seek(0, 2) - torn)
    return [row for _, row in rows]


def read_json(path: str | Path, error: type[Exception], hint: str = "") -> Any:
    """The JSON document in ``path``; one that is not UTF-8 or not JSON raises ``error`` as
    ``FILE: not JSON (why)`` followed by ``; hint`` when given. Opening the file raises ``OSError`` as
    usual."""
    data = Path(path).read_bytes()
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as err:
        why = (
            f"{err.msg} at line {err.lineno}, column {err.colno}"
            if isinstance(err, json.JSONDecodeError)
            else f"{type(err).__name__}: {err}"
        )
        raise error(f"{path}: not JSON ({why}){'; ' + hint if hint else ''}") from err
