"""The per-sample JSONL of a run: one line per ``(problem, sample)``, appended as each is scored, so
an interrupted run resumes where it stopped.

A line: ``id``, ``sample`` (0..n-1), ``problem_hash`` (:func:`problem_hash`: what the problem was when
the sample was made), ``subset``, ``prompt`` (the messages sent), ``completion`` (the assistant message;
for episodes the final answer), ``score``, ``reason`` and what it cost
(``prompt_tokens``, ``completion_tokens``, ``latency_s``, ``finish_reason``; for episodes ``steps``,
``tokens``, ``resets``, ``stop_reason`` and the whole conversation as ``messages``).

:func:`read_samples` takes the lines back (:func:`dsv32.jsonl.read_log`): a last line cut short by an
interruption is dropped and cut off the file, any other unreadable line is an error.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from pathlib import Path
from typing import Any

from dsv32.eval.errors import EvalError
from dsv32.eval.types import Problem
from dsv32.jsonl import read_log


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    raise TypeError(f"a problem holds a {type(value).__name__}, which has no stable JSON form")


def canonical_digest(value: object) -> str:
    """The SHA-256 (hex) of ``value`` as canonical JSON: keys sorted, no spaces, UTF-8 as is."""
    canonical = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=_plain)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def problem_hash(problem: Problem) -> str:
    """16 hex digits of the SHA-256 of what the model is sent and what it is graded against (the
    problem's ``messages``, ``tools`` and ``data``, as canonical JSON): a sample counts for a problem
    only while this is unchanged. The subset is left out: it labels the problem, and the report reads
    it from the problem."""
    return canonical_digest({"messages": problem.messages, "tools": problem.tools, "data": problem.data})[:16]


def first_of_each(rows: list[dict]) -> list[dict]:
    """``rows`` with one line per ``(id, sample)``: the first in file order (a directory that two runs
    wrote at once may hold a pair twice; it counts once)."""
    seen: set[tuple] = set()
    out = []
    for row in rows:
        key = (row.get("id"), row.get("sample"))
        if key not in seen:
            seen.add(key)
            out.append(row)
    return out


def sample_line(row: dict) -> str:
    """One line of ``samples.jsonl``."""
    return json.dumps(row, ensure_ascii=False, default=str) + "\n"


def read_samples(path: Path) -> list[dict]:
    return read_log(path, EvalError, "remove the line or use --fresh")


class SampleWriter:
    """Appends sample lines (thread-safe; each line flushed)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.file = path.open("a", encoding="utf-8")

    def write(self, row: dict) -> None:
        line = sample_line(row)
        with self.lock:
            self.file.write(line)
            self.file.flush()

    def close(self) -> None:
        self.file.close()
