"""Reading answers out of completions: ``\\boxed{}``, option letters, fenced code, math equality.

- :func:`last_boxed`: the content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced,
  None when the last box is cut off (:mod:`dsv32.envs.mathcheck`, shared with the environments and RL);
- :func:`choice_letter`: an option letter from ``\\boxed{C}``, else the last "answer is (C)" /
  "Answer: C" phrase (the patterns of lm-evaluation-harness's MMLU-Pro and GPQA filters);
- :func:`code_blocks`: the bodies of Markdown fenced code blocks, in order;
- :func:`math_equal`: math-verify through :func:`dsv32.envs.mathcheck.answers_equal`, the same
  comparison as the RL math reward, with a timeout that holds in the runner's scoring threads.
"""

from __future__ import annotations

import re

from dsv32.envs.mathcheck import answers_equal, last_boxed

MATH_TIMEOUT_S = 5
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_ANSWER_IS = re.compile(
    r"(?:answer|option|choice)\s*(?:is|:)?\s*[:\-]?\s*\**\(?\s*([A-Z])\s*\)?(?![A-Za-z])", re.I
)


def choice_letter(text: str | None, letters: str) -> str | None:
    """The option letter (one of ``letters``) the completion picked, or None."""
    if not text:
        return None
    boxed = last_boxed(text)
    if boxed is not None:
        inner = re.sub(r"\\text\{([^}]*)\}", r"\1", boxed).strip().strip("()").strip()
        if len(inner) == 1 and inner.upper() in letters:
            return inner.upper()
        head = re.match(r"([A-Z])[\).:\s]", inner + " ")
        if head and head.group(1) in letters:
            return head.group(1)
    picked = [m.group(1).upper() for m in _ANSWER_IS.finditer(text) if m.group(1).upper() in letters]
    return picked[-1] if picked else None


def code_blocks(text: str | None) -> list[tuple[str, str]]:
    """``[(language, code)]`` of the fenced blocks in ``text`` (an unclosed last block included)."""
    if not text:
        return []
    return [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(text)]


def math_equal(gold: str, answer: str | None) -> bool:
    """Whether ``answer`` equals ``gold`` mathematically; None or blank is never equal. Equal text is
    equal without a parse (an answer math-verify cannot read still matches itself); anything else
    goes to :func:`dsv32.envs.mathcheck.answers_equal`, bounded by ``MATH_TIMEOUT_S`` in every thread
    (the runner scores in threads)."""
    if answer is None or not answer.strip():
        return False
    if answer.strip() == gold.strip():
        return True
    return answers_equal(answer, gold, timeout_seconds=MATH_TIMEOUT_S)
