"""Bring-your-own benchmark files (``--data FILE.jsonl``, one JSON object a line).

``byo-boxed`` (AIME, HMMT, IMOAnswerBench, HLE exact-match): ``{"id"?, "problem" | "question",
"answer"}``. Prompt: the paper's math template (§4.1). Score: math-verify of the last ``\\boxed{}``
against ``answer``.

``byo-mcq`` (GPQA, MMLU-Pro, multiple-choice HLE), in either shape:

- MMLU-Pro's: ``{"question", "options": [...], "answer": "C" | "answer_index": 2, "category"?}``
  (``"choices"`` is read as ``"options"``; an integer ``answer`` is an index);
- GPQA's: ``{"Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect
  Answer 3", "Subdomain"?}``: the options are shuffled with a seeded RNG per row (the same order on
  every run), as GPQA's authors recommend.

Prompt: the question, the options as ``A) ...``, and the request to reason step by step and put the
option's letter within ``\\boxed{}``. Score: the letter read by :func:`~dsv32.eval.answers.choice_letter`.

``byo-swe``: SWE-bench-shaped instances ``{"instance_id", "problem_statement", "FAIL_TO_PASS",
"PASS_TO_PASS", ...}`` (the test lists as JSON lists or as SWE-bench's JSON-encoded strings), run by
the ``swe`` environment of :mod:`dsv32.envs` (no Docker: a sandboxed copy of the repository). Every
other field goes to the task's ``info``, where the environment reads what it needs to build the
repository (see docs/envs.md); it rejects instances it cannot build offline.
"""

from __future__ import annotations

import json
import math
import random
import string
from typing import Any

from dsv32.chat.templates import MATH_PROMPT
from dsv32.eval.agentic import EnvBenchmark, task_problem
from dsv32.eval.answers import choice_letter, last_boxed, math_equal
from dsv32.eval.errors import EvalError
from dsv32.eval.samples import canonical_digest
from dsv32.eval.types import Benchmark, Problem, Score
from dsv32.jsonl import read_jsonl

MCQ_SUFFIX = (
    "Please reason step by step, and put the letter of the correct option (just the letter) within \\boxed{}."
)
_ID_KEYS = ("id", "ID", "instance_id", "question_id", "problem_id", "Record ID")


def read_rows(path: str | None, benchmark: str) -> list[tuple[str, dict]]:
    """``[(id, row)]`` of a JSONL file; errors name the file and line.

    A row's id is its ``id`` field (or ``instance_id``, ``question_id``, ...); a row without one is
    named by its content (:func:`content_id`), so the id of a problem stays the same when lines are
    added, removed or reordered around it, and an edited row is a new problem."""
    if path is None:
        raise EvalError(f"{benchmark} reads your benchmark file: pass --data FILE.jsonl")
    rows, seen = [], {}
    for n, row in read_jsonl(path, EvalError):
        where = f"{path}:{n}"
        if not isinstance(row, dict):
            raise EvalError(f"{where}: a row is a JSON object, got {_kind(row)}")
        key = next((k for k in _ID_KEYS if k in row), None)
        if key is None:
            rid = content_id(row)
        elif isinstance(row[key], int) and not isinstance(row[key], bool):
            rid = str(row[key])
        elif isinstance(row[key], str) and row[key].strip():
            rid = row[key]
        else:
            raise EvalError(
                f"{where}: field {key!r} must be a non-empty string or an integer, got {_kind(row[key])}"
            )
        if rid in seen:
            if key is None:
                raise EvalError(
                    f"{where}: the same row as line {seen[rid]} (a row without an id is named by its content); "
                    "remove one or give the rows ids"
                )
            raise EvalError(f"{where}: duplicate id {rid!r} (first on line {seen[rid]})")
        seen[rid] = n
        rows.append((rid, {**row, "_where": where}))
    if not rows:
        raise EvalError(f"{path} holds no rows")
    return rows


def content_id(row: dict) -> str:
    """``row-`` and 12 hex digits of the SHA-256 of the row's canonical JSON (keys sorted)."""
    return "row-" + canonical_digest(row)[:12]


def _kind(value: Any) -> str:
    """The JSON type of ``value`` as messages name it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return "an empty string" if not value.strip() else f"the string {value[:40]!r}"
    return {dict: "an object", list: "a list"}.get(type(value), type(value).__name__)


def _field(row: dict, *names: str) -> Any:
    for name in names:
        if name in row:
            return row[name]
    raise EvalError(f"{row['_where']}: missing field {' or '.join(repr(n) for n in names)}")


def _name(row: dict, *names: str) -> str:
    """The first of ``names`` the row has (for messages about its value)."""
    return next(n for n in names if n in row)


def _text(row: dict, *names: str, numbers: bool = False) -> str:
    """Field ``names[0]`` (or the first alternative present) as text: a non-empty string, or with
    ``numbers`` also a finite number (not a boolean), written as JSON writes it."""
    value = _field(row, *names)
    if isinstance(value, str) and value.strip():
        return value
    if numbers and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return str(value)
    wanted = "a non-empty string or a number" if numbers else "a non-empty string"
    raise EvalError(f"{row['_where']}: field {_name(row, *names)!r} must be {wanted}, got {_kind(value)}")


def _label(row: dict, *names: str) -> str:
    """An optional label (``subset``, ``category``, ...): a string, ``""`` when absent or null."""
    present = [n for n in names if n in row and row[n] is not None]
    if not present:
        return ""
    value = row[present[0]]
    if not isinstance(value, str):
        raise EvalError(f"{row['_where']}: field {present[0]!r} must be a string, got {_kind(value)}")
    return value


class _FromFile(Benchmark):
    """A benchmark of the ``--data`` file: one problem a row (:meth:`problem`)."""

    source = "--data FILE.jsonl"
    needs_data = True

    def problems(self, subset: list[str] | None = None, data: str | None = None) -> list[Problem]:
        return [self.problem(rid, row) for rid, row in read_rows(data, self.name)]

    def problem(self, rid: str, row: dict) -> Problem:
        raise NotImplementedError


class Boxed(_FromFile):
    name = "byo-boxed"
    description = "your JSONL of problems with exact answers (AIME/HMMT shape), math-verify on \\boxed{}"
    metric = "accuracy"

    def problem(self, rid: str, row: dict) -> Problem:
        question = _text(row, "problem", "question", "Question")
        answer = _text(row, "answer", "Answer", numbers=True)
        messages = [{"role": "user", "content": MATH_PROMPT.format(question=question)}]
        return Problem(rid, messages, [], _label(row, "subset"), {"answer": answer})

    def score(self, problem: Problem, message: dict) -> Score:
        answer = last_boxed(message.get("content"))
        if answer is None:
            return Score(0.0, "no \\boxed{} answer")
        ok = math_equal(problem.data["answer"], answer)
        return Score(float(ok), f"answered {answer[:80]!r}, expected {problem.data['answer'][:80]!r}")

    def reference(self, problem: Problem) -> dict:
        return {"role": "assistant", "content": f"\\boxed{{{problem.data['answer']}}}"}


def mcq_options(rid: str, row: dict) -> tuple[list[str], int, str]:
    """``(options, index of the correct one, subset)`` of an MMLU-Pro- or GPQA-shaped row."""
    where = row["_where"]
    if "Correct Answer" in row:
        wrong = sorted((k for k in row if k.startswith("Incorrect Answer")), key=lambda k: (len(k), k))
        if not wrong:
            raise EvalError(f"{where}: a GPQA-shaped row needs 'Incorrect Answer 1' (and more)")
        options = [_text(row, k, numbers=True).strip() for k in ("Correct Answer", *wrong)]
        order = list(range(len(options)))
        random.Random(f"gpqa:{rid}").shuffle(order)
        return [options[i] for i in order], order.index(0), _label(row, "Subdomain")
    raw = _field(row, "options", "choices")
    if not isinstance(raw, list) or len(raw) < 2:
        raise EvalError(f"{where}: 'options' must be a list of at least two options")
    options = []
    for i, option in enumerate(raw):
        if isinstance(option, bool) or not isinstance(option, (str, int, float)) or not str(option).strip():
            raise EvalError(
                f"{where}: option {i} ({string.ascii_uppercase[i % 26]}) must be a non-empty string or a "
                f"number, got {_kind(option)}"
            )
        options.append(str(option))
    return options, _answer_index(row, len(options)), _label(row, "category", "subset")


def _answer_index(row: dict, count: int) -> int:
    """The correct option's index from ``answer`` (a letter, or an index) and/or ``answer_index``
    (an index); both given must agree."""
    where, indices = row["_where"], {}
    if "answer" in row:
        answer = row["answer"]
        if (
            isinstance(answer, str)
            and len(answer.strip()) == 1
            and answer.strip().upper() in string.ascii_uppercase
        ):
            indices["answer"] = string.ascii_uppercase.index(answer.strip().upper())
        elif isinstance(answer, int) and not isinstance(answer, bool):
            indices["answer"] = answer
        else:
            raise EvalError(
                f"{where}: field 'answer' must be an option letter (A, B, ...) or an index, got {_kind(answer)}"
            )
    if "answer_index" in row:
        index = row["answer_index"]
        if isinstance(index, bool) or not isinstance(index, int):
            raise EvalError(f"{where}: field 'answer_index' must be an integer, got {_kind(index)}")
        indices["answer_index"] = index
    if not indices:
        raise EvalError(f"{where}: 'answer' must be an option letter or 'answer_index' an index")
    if len(set(indices.values())) > 1:
        raise EvalError(
            f"{where}: 'answer' {row['answer']!r} and 'answer_index' {row['answer_index']!r} name different "
            "options; keep one, or make them agree"
        )
    index = next(iter(indices.values()))
    if not 0 <= index < count:
        raise EvalError(f"{where}: the answer points past the {count} options")
    return index


class MultipleChoice(_FromFile):
    name = "byo-mcq"
    description = "your JSONL of multiple-choice questions (MMLU-Pro or GPQA shape), letter in \\boxed{}"
    metric = "accuracy"

    def problem(self, rid: str, row: dict) -> Problem:
        options, index, sub = mcq_options(rid, row)
        if len(options) > 26:
            raise EvalError(f"{row['_where']}: more than 26 options")
        letters = string.ascii_uppercase[: len(options)]
        question = _text(row, "question", "Question")
        listed = "\n".join(f"{letter}) {option}" for letter, option in zip(letters, options))
        content = f"{question}\n\n{listed}\n\n{MCQ_SUFFIX}"
        data = {"letters": letters, "answer": letters[index]}
        return Problem(rid, [{"role": "user", "content": content}], [], sub, data)

    def score(self, problem: Problem, message: dict) -> Score:
        letter = choice_letter(message.get("content"), problem.data["letters"])
        expected = problem.data["answer"]
        if letter is None:
            return Score(0.0, f"no option letter found (expected {expected})")
        return Score(float(letter == expected), f"answered {letter}, expected {expected}")

    def reference(self, problem: Problem) -> dict:
        return {"role": "assistant", "content": f"The answer is \\boxed{{{problem.data['answer']}}}."}


def _tests(row: dict, key: str) -> list[str]:
    value = _field(row, key)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise EvalError(f"{row['_where']}: {key} is a string but not a JSON list ({err.msg})") from err
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise EvalError(f"{row['_where']}: {key} must be a list of test ids")
    return value


class SweBench(_FromFile, EnvBenchmark):
    name = "byo-swe"
    description = "your SWE-bench-shaped JSONL (FAIL_TO_PASS / PASS_TO_PASS), the swe environment, no Docker"
    env_name = "swe"

    def problems(self, subset: list[str] | None = None, data: str | None = None) -> list[Problem]:
        from dsv32.envs.base import registry

        if self.env_name not in registry():
            raise EvalError("byo-swe runs the 'swe' environment of dsv32.envs, which is not registered here")
        return super().problems(subset, data)

    def problem(self, rid: str, row: dict) -> Problem:
        from dsv32.envs.base import Task

        statement = _text(row, "problem_statement", "prompt")
        info = {k: v for k, v in row.items() if k not in ("_where", "problem_statement", "prompt")}
        info["FAIL_TO_PASS"], info["PASS_TO_PASS"] = _tests(row, "FAIL_TO_PASS"), _tests(row, "PASS_TO_PASS")
        return task_problem(Task(rid, statement, None, _label(row, "repo"), info))
