"""Rule-based outcome rewards (paper §3): is the final answer right, and is it where it should be?

- :func:`math_reward` — 1 if the last ``\\boxed{}`` is mathematically equal to the reference
  (math-verify, see :mod:`dsv32.envs.mathcheck`), else 0.
- :func:`exact_match_reward` — 1 if the final answer equals the reference after normalisation.
- :func:`format_reward` — 1 if the completion has the expected shape (closed thinking, one box).

Completions in thinking mode read ``reasoning</think>answer`` (the prompt ends with ``<think>``, see
:mod:`dsv32.chat.encode`); :func:`answer_part` cuts the reasoning off.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from dsv32.chat.protocol import EOS, THINK_END, THINK_START
from dsv32.envs.mathcheck import answers_equal, boxes
from dsv32.envs.mathcheck import last_boxed as extract_boxed

_ANSWER_LINE = re.compile(
    r"^[\s*#>_`]*(?:the\s+)?(?:final\s+)?answer(?:\s+is)?[\s*_]*[:：](.*)$", re.IGNORECASE | re.MULTILINE
)
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|operatorname)\s*\{([^{}]*)\}")


def answer_part(completion: str, *, thinking: bool = False) -> str:
    """The answer the user sees: without the reasoning (everything up to ``</think>``) and the
    end-of-sentence token. In thinking mode a completion that never closed its reasoning has no
    answer (``""``); otherwise a completion without ``</think>`` is all answer."""
    text = completion.replace(EOS, "")
    head, sep, tail = text.rpartition(THINK_END)
    if not sep:
        return "" if thinking else text
    return tail


def math_reward(completion: str, answer: str | int | float, *, timeout_seconds: float | None = 5) -> float:
    """1.0 if the last ``\\boxed{}`` in ``completion`` equals ``answer`` mathematically (``\\frac{3}{4}``
    vs ``"0.75"``, ``1,000`` vs ``"1000"``), else 0.0; no box, an empty or cut-off box → 0.0. Never
    raises on odd text, in any thread; ``timeout_seconds`` bounds the check (see :mod:`dsv32.envs.mathcheck`)."""
    boxed = extract_boxed(completion)
    if boxed is None or not boxed.strip():
        return 0.0
    return 1.0 if answers_equal(boxed, str(answer), timeout_seconds=timeout_seconds) else 0.0


def final_answer(completion: str) -> str:
    """The answer to compare: the last ``\\boxed{}`` if any, else the last ``Answer: X`` line (also
    ``Final answer:``, ``**Answer:**``), else the whole text after the reasoning."""
    text = answer_part(completion)
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    lines = _ANSWER_LINE.findall(text)
    return lines[-1] if lines else text


def normalize_answer(text: str) -> str:
    """Case-folded, whitespace-collapsed, without surrounding markdown/``$``/quotes, ``\\text{}``
    wrappers and trailing periods: ``" **Paris.** "`` → ``"paris"``."""
    text = _TEXT_WRAPPER.sub(r"\1", text)
    text = " ".join(text.split()).strip(" *_`$\"'")
    text = text.rstrip(".。 ").strip(" *_`$\"'")
    return text.casefold()


def exact_match_reward(completion: str, answer: str | Sequence[str], *, normalize: bool = True) -> float:
    """1.0 if the final answer (:func:`final_answer`) equals ``answer`` (or one of several accepted
    answers), compared after :func:`normalize_answer` when ``normalize`` else after ``strip()``."""
    accepted = [answer] if isinstance(answer, str) else list(answer)
    if not accepted:
        raise ValueError("exact_match_reward needs at least one accepted answer")
    norm = normalize_answer if normalize else str.strip
    got = norm(final_answer(completion))
    return 1.0 if any(got == norm(a) for a in accepted) else 0.0


def format_reward(completion: str, *, require_boxed: bool = True, thinking: bool = False) -> float:
    """1.0 if ``completion`` has the expected shape, else 0.0:

    - ``thinking=True``: exactly one ``</think>``, at most one ``<think>`` (before it), and a
      non-empty answer after it;
    - ``require_boxed=True``: the answer part holds exactly one ``\\boxed{}``, closed and non-empty
      (the whole completion when not ``thinking``: a box in a chain of thought counts too).
    """
    text = completion.replace(EOS, "")
    if thinking:
        if text.count(THINK_END) != 1 or text.count(THINK_START) > 1:
            return 0.0
        head, _, text = text.partition(THINK_END)
        if THINK_START in text or not text.strip():
            return 0.0
    if require_boxed:
        found = boxes(text)
        if len(found) != 1 or found[0][1] is None or not found[0][1].strip():
            return 0.0
    return 1.0
