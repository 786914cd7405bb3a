"""Reading answers out of completions: ``\\boxed{}``, option letters, fenced code, math equality.

- :func:`last_boxed`: the content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced;
- :func:`choice_letter`: an option letter from ``\\boxed{C}``, else the last "answer is (C)" /
  "Answer: C" phrase (the patterns of lm-evaluation-harness's MMLU-Pro and GPQA filters);
- :func:`code_blocks`: the bodies of Markdown fenced code blocks, in order;
- :func:`math_equal`: math-verify's ``verify(parse(gold), parse(answer))``, with the answer wrapped
  in ``\\boxed{}`` so it is read as the final answer; math-verify's timeout uses ``signal.alarm``, so
  it applies on the main thread only (elsewhere, where the runner's scoring threads are, none).
"""

from __future__ import annotations

import logging
import re
import threading

MATH_TIMEOUT_S = 5
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_ANSWER_IS = re.compile(
    r"(?:answer|option|choice)\s*(?:is|:)?\s*[:\-]?\s*\**\(?\s*([A-Z])\s*\)?(?![A-Za-z])", re.I
)


def last_boxed(text: str | None) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` (nested braces kept), or None."""
    if not text:
        return None
    found = None
    for match in _BOXED.finditer(text):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                found = text[start:i].strip()
                break
    return found


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
    """Whether ``answer`` equals ``gold`` mathematically (math-verify); None is never equal."""
    if answer is None or not answer.strip():
        return False
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    timeout = MATH_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold_parsed = parse(f"\\boxed{{{gold}}}", parsing_timeout=timeout)
    answer_parsed = parse(f"\\boxed{{{answer}}}", parsing_timeout=timeout)
    if not gold_parsed or not answer_parsed:
        return gold.strip() == answer.strip()
    return bool(verify(gold_parsed, answer_parsed, timeout_seconds=timeout))
