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
import random
import string
from typing import Any

from dsv32.chat.templates import MATH_PROMPT
from dsv32.eval.agentic import EnvBenchmark, task_problem
from dsv32.eval.answers import choice_letter, last_boxed, math_equal
from dsv32.eval.errors import EvalError
from dsv32.eval.types import Benchmark, Problem, Score
from dsv32.jsonl import read_jsonl

MCQ_SUFFIX = (
    "Please reason step by step, and put the letter of the correct option (just the letter) within \\boxed{}."
)
_ID_KEYS = ("id", "ID", "instance_id", "question_id", "problem_id", "Record ID")


def read_rows(path: str | None, benchmark: str) -> list[tuple[str, dict]]:
    """``[(id, row)]`` of a JSONL file; errors name the file and line."""
    if path is None:
        raise EvalError(f"{benchmark} reads your benchmark file: pass --data FILE.jsonl")
    rows, seen = [], set()
    for n, row in read_jsonl(path, EvalError):
        if not isinstance(row, dict):
            raise EvalError(f"{path}:{n}: a row is a JSON object, got {type(row).__name__}")
        rid = str(next((row[k] for k in _ID_KEYS if k in row), n))
        if rid in seen:
            raise EvalError(f"{path}:{n}: duplicate id {rid!r}")
        seen.add(rid)
        rows.append((rid, {**row, "_where": f"{path}:{n}"}))
    if not rows:
        raise EvalError(f"{path} holds no rows")
    return rows


def _field(row: dict, *names: str) -> Any:
    for name in names:
        if name in row:
            return row[name]
    raise EvalError(f"{row['_where']}: missing field {' or '.join(repr(n) for n in names)}")


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
        question, answer = _field(row, "problem", "question", "Question"), _field(row, "answer", "Answer")
        messages = [{"role": "user", "content": MATH_PROMPT.format(question=question)}]
        return Problem(rid, messages, [], str(row.get("subset", "")), {"answer": str(answer)})

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
    if "Correct Answer" in row:
        wrong = [row[k] for k in sorted(row) if k.startswith("Incorrect Answer")]
        options = [row["Correct Answer"], *wrong]
        order = list(range(len(options)))
        random.Random(f"gpqa:{rid}").shuffle(order)
        return [str(options[i]).strip() for i in order], order.index(0), str(row.get("Subdomain", ""))
    options = _field(row, "options", "choices")
    if not isinstance(options, list) or len(options) < 2:
        raise EvalError(f"{row['_where']}: 'options' must be a list of at least two options")
    answer = row.get("answer_index", row.get("answer"))
    if (
        isinstance(answer, str)
        and len(answer.strip()) == 1
        and answer.strip().upper() in string.ascii_uppercase
    ):
        index = string.ascii_uppercase.index(answer.strip().upper())
    elif isinstance(answer, int):
        index = answer
    else:
        raise EvalError(f"{row['_where']}: 'answer' must be an option letter or 'answer_index' an index")
    if not 0 <= index < len(options):
        raise EvalError(f"{row['_where']}: the answer points past the {len(options)} options")
    return [str(o) for o in options], index, str(row.get("category", row.get("subset", "")))


class MultipleChoice(_FromFile):
    name = "byo-mcq"
    description = "your JSONL of multiple-choice questions (MMLU-Pro or GPQA shape), letter in \\boxed{}"
    metric = "accuracy"

    def problem(self, rid: str, row: dict) -> Problem:
        options, index, sub = mcq_options(rid, row)
        if len(options) > 26:
            raise EvalError(f"{row['_where']}: more than 26 options")
        letters = string.ascii_uppercase[: len(options)]
        question = _field(row, "question", "Question")
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

        statement = _field(row, "problem_statement", "prompt")
        info = {k: v for k, v in row.items() if k not in ("_where", "problem_statement", "prompt")}
        info["FAIL_TO_PASS"], info["PASS_TO_PASS"] = _tests(row, "FAIL_TO_PASS"), _tests(row, "PASS_TO_PASS")
        return task_problem(Task(rid, statement, None, str(row.get("repo", "")), info))
