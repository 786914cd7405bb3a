"""Prompt sources for RL: what the policy is asked, and what the reward checks against.

A :class:`Task` is one prompt with its domain (which reward applies, which KL strength) and, where
there is one, its reference answer or grading rubric. Sources:

- :class:`ArithmeticWordProblems` — procedurally generated grade-school word problems with exact
  integer answers (one or two operations), for the math reward. Deterministic: problem ``i`` of a
  split is a function of ``(seed, split, i)``; the held-out split never repeats a training question.
- :class:`JsonlTasks` — your own prompts: one JSON object per line with ``prompt`` (or
  ``question``), optional ``answer``, ``rubric``, ``domain``.
- :class:`MixedTasks` — several sources drawn with fixed weights: the paper mixes reasoning, agent
  and alignment data in one RL stage so that no domain is forgotten.

Math prompts use the paper's evaluation template (Appendix D): ``{question}\\nPlease reason step by
step, and put your final answer within \\boxed{}.``
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dsv32.chat.templates import MATH_PROMPT
from dsv32.errors import DSV32Error
from dsv32.jsonl import read_jsonl

# For small models that do not know the \boxed{} convention: a short-answer instruction and a system
# prompt with one worked example (a cold-start prompt in the spirit of the paper's Appendix B).
BRIEF_TEMPLATE = "{question}\nGive a short answer and put the final number in \\boxed{{}}."
BRIEF_SYSTEM = (
    "Answer math word problems briefly and put the final number in \\boxed{}.\n"
    "Example: Tom has 3 apples and gets 2 more. How many apples does Tom have now?\n"
    "Answer: 3 + 2 = 5. Tom has \\boxed{5} apples."
)
TEMPLATES = {"paper": (MATH_PROMPT, None), "brief": (BRIEF_TEMPLATE, BRIEF_SYSTEM)}


class TaskError(DSV32Error, ValueError):
    """A task source that cannot be read or does not fit the expected format."""


@dataclass(frozen=True)
class Task:
    """One RL prompt. ``prompt`` is the user message; ``answer`` the reference for rule-based rewards;
    ``rubric`` the grading rubric for the generative reward model; ``domain`` selects the reward and
    the KL coefficient."""

    id: str
    domain: str
    prompt: str
    answer: str | None = None
    rubric: str | None = None
    system: str | None = None


def _rng(*parts: object) -> random.Random:
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


_NAMES = ["Ava", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kira", "Liam"]
_ITEMS = ["apples", "books", "marbles", "stickers", "pencils", "cookies", "coins", "cards", "shells", "eggs"]
_PLACES = ["box", "bag", "basket", "jar", "shelf", "drawer"]


def _add(r: random.Random, n: int) -> tuple[str, int]:
    name, item = r.choice(_NAMES), r.choice(_ITEMS)
    a, b = r.randint(2, n), r.randint(2, n)
    return f"{name} has {a} {item}. {name} gets {b} more {item}. How many {item} does {name} have now?", a + b


def _sub(r: random.Random, n: int) -> tuple[str, int]:
    name, item = r.choice(_NAMES), r.choice(_ITEMS)
    a = r.randint(3, n + 2)
    b = r.randint(1, a - 1)
    return f"{name} had {a} {item} and gave away {b} of them. How many {item} does {name} have left?", a - b


def _mul(r: random.Random, n: int) -> tuple[str, int]:
    item, place = r.choice(_ITEMS), r.choice(_PLACES)
    a, b = r.randint(2, max(2, n // 2)), r.randint(2, 9)
    return (
        f"There are {a} {place}es with {b} {item} in each {place}. How many {item} are there in total?",
        a * b,
    )


def _two_step(r: random.Random, n: int) -> tuple[str, int]:
    name, item = r.choice(_NAMES), r.choice(_ITEMS)
    a, b = r.randint(5, n + 5), r.randint(2, n)
    c = r.randint(1, a + b - 1)
    q = (
        f"{name} has {a} {item}, buys {b} more, and then gives {c} to a friend. "
        f"How many {item} does {name} have now?"
    )
    return q, a + b - c


_KINDS = {"add": _add, "sub": _sub, "mul": _mul, "two_step": _two_step}


@dataclass
class ArithmeticWordProblems:
    """Grade-school word problems with integer answers.

    ``kinds``: which templates (``add``, ``sub``, ``mul``, ``two_step``); ``max_operand``: operand
    range (difficulty); ``split``: ``"train"`` or ``"eval"`` — eval questions are generated first
    and excluded from train, so the splits never share a question; ``template``: ``"paper"`` (the
    paper's math prompt) or ``"brief"`` (short answer, with a one-example system prompt).
    """

    seed: int = 0
    kinds: Sequence[str] = ("add", "sub", "mul", "two_step")
    max_operand: int = 20
    domain: str = "math"
    split: str = "train"
    eval_size: int = 200
    template: str = "paper"
    _eval_questions: set[str] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.kinds) - set(_KINDS))
        if unknown or not self.kinds:
            raise TaskError(f"unknown arithmetic kinds {unknown}; known: {sorted(_KINDS)}")
        if self.template not in TEMPLATES:
            raise TaskError(f"unknown template {self.template!r}; known: {sorted(TEMPLATES)}")
        if self.split not in ("train", "eval"):
            raise TaskError(f"split must be 'train' or 'eval', got {self.split!r}")
        if self.split == "train":
            held_out = ArithmeticWordProblems(
                self.seed, self.kinds, self.max_operand, self.domain, "eval", self.eval_size
            )
            self._eval_questions = {held_out._make(i)[0] for i in range(self.eval_size)}

    def _make(self, i: int) -> tuple[str, int]:
        r = _rng("arith", self.seed, self.split, i)
        return _KINDS[r.choice(list(self.kinds))](r, self.max_operand)

    def get(self, i: int) -> Task:
        """Problem ``i`` of the split (train skips questions that are in the eval split)."""
        attempt = 0
        while True:
            question, answer = self._make(i if attempt == 0 else f"{i}.{attempt}")
            if question not in self._eval_questions:
                break
            attempt += 1
        template, system = TEMPLATES[self.template]
        return Task(
            id=f"arith-{self.split}-{i}",
            domain=self.domain,
            prompt=template.format(question=question),
            answer=str(answer),
            system=system,
        )

    def take(self, n: int, start: int = 0) -> list[Task]:
        return [self.get(i) for i in range(start, start + n)]


@dataclass
class JsonlTasks:
    """Tasks from a JSONL file: ``prompt`` or ``question`` (a string; ``question`` is wrapped in the math
    template when the domain is ``math``), optional ``answer`` (a string, or a number taken as its
    JSON text), ``rubric``, ``domain`` (default ``domain``), ``system`` (strings) and ``id`` (a string
    or an integer); other keys are kept out of the task and ignored. Problem ``i`` wraps around the
    file. ``check(task)`` returns what stops a task from being used (its domain has no reward, say) or
    None; every row is checked as it is read, and a problem raises :class:`TaskError` naming
    ``FILE:LINE``."""

    path: str
    domain: str = "general"
    check: Callable[[Task], str | None] | None = field(default=None, repr=False)
    tasks: list[Task] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        path = Path(self.path)
        try:
            rows = list(read_jsonl(path, TaskError))
        except OSError as err:
            raise TaskError(f"cannot read tasks from {path}: {err}") from err
        for n, rec in rows:
            task = _task(rec, f"{path}:{n}", f"{path.stem}-{n}", self.domain)
            problem = self.check(task) if self.check is not None else None
            if problem:
                if "domain" not in rec:
                    problem += f" (the row has no 'domain'; {self.domain!r} is the source's default)"
                raise TaskError(f"{path}:{n}: {problem}")
            self.tasks.append(task)
        if not self.tasks:
            raise TaskError(f"{path} holds no tasks")

    def get(self, i: int) -> Task:
        return self.tasks[i % len(self.tasks)]


def _task(rec: object, where: str, default_id: str, default_domain: str) -> Task:
    """One JSONL row as a :class:`Task`; a field of the wrong type raises :class:`TaskError`."""
    if not isinstance(rec, dict):
        raise TaskError(f"{where}: a task is a JSON object, got {type(rec).__name__}")
    text = rec.get("prompt", rec.get("question"))
    if not isinstance(text, str) or not text.strip():
        raise TaskError(f"{where}: needs a non-empty string 'prompt' or 'question'")

    def optional_str(key: str, default: str | None = None) -> str | None:
        value = rec.get(key, default)
        if value is not None and not isinstance(value, str):
            raise TaskError(f"{where}: {key!r} must be a string, got {json.dumps(value)}")
        return value

    domain = optional_str("domain", default_domain)
    if not domain:
        raise TaskError(f"{where}: 'domain' must be a non-empty string")
    answer = rec.get("answer")
    if (
        isinstance(answer, bool)
        or not isinstance(answer, str | int | float | None)
        or (isinstance(answer, float) and not math.isfinite(answer))
    ):
        raise TaskError(
            f"{where}: 'answer' must be a string or a number (the reference answer), got {json.dumps(answer)}"
        )
    task_id = rec.get("id", default_id)
    if isinstance(task_id, bool) or not isinstance(task_id, str | int):
        raise TaskError(f"{where}: 'id' must be a string or an integer, got {json.dumps(task_id)}")
    if isinstance(answer, str) and not answer.strip():
        answer = None  # an empty reference would give an empty completion full exact-match credit
    if "prompt" not in rec and domain == "math":
        text = MATH_PROMPT.format(question=text)
    return Task(
        id=str(task_id),
        domain=domain,
        prompt=text,
        answer=None if answer is None else (answer if isinstance(answer, str) else json.dumps(answer)),
        rubric=optional_str("rubric"),
        system=optional_str("system"),
    )


@dataclass
class MixedTasks:
    """Draws from several sources with fixed weights. ``sample(step, n)`` is a function of
    ``(seed, step, n)`` (``n`` the same at every step); each source keeps its own running index (the
    items it gave in all earlier steps and earlier in this one), so no prompt repeats before the
    source wraps around."""

    sources: list[tuple[object, float]]
    seed: int = 0
    # (step, n, counts before that step): consecutive steps replay one step each, not all of them
    _memo: tuple[int, int, list[int]] = field(default=(0, 0, []), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.sources or any(w <= 0 for _, w in self.sources):
            raise TaskError("MixedTasks needs at least one source, each with a positive weight")

    def sample(self, step: int, n: int) -> list[Task]:
        counts = self._counts_before(step, n)
        out = []
        for s in self._picks(step, n):
            out.append(self.sources[s][0].get(counts[s]))
            counts[s] += 1
        return out

    def _picks(self, step: int, n: int) -> list[int]:
        r = _rng("mix", self.seed, step)
        return r.choices(range(len(self.sources)), weights=[w for _, w in self.sources], k=n)

    def _counts_before(self, step: int, n: int) -> list[int]:
        """Items each source gave in steps ``0 … step − 1``, replayed from the seed (so a resumed run
        goes on where it stopped)."""
        done, memo_n, counts = self._memo
        if memo_n != n or done > step or len(counts) != len(self.sources):
            done, counts = 0, [0] * len(self.sources)
        counts = list(counts)
        for s in range(done, step):
            for k in self._picks(s, n):
                counts[k] += 1
        self._memo = (step, n, list(counts))
        return counts
