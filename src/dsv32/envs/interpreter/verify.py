"""The code interpreter's verifier: the last ``\\boxed{…}`` of the final answer, checked with
math-verify against the task's answer.

math-verify's own timeout uses ``signal.alarm`` and so works only in the main thread; elsewhere (an
agent running episodes in threads) it runs without one, and the boxed text is capped at
``MAX_ANSWER_CHARS`` so a pathological expression stays small.
"""

from __future__ import annotations

import logging
import threading

MAX_ANSWER_CHARS = 300
TIMEOUT_S = 5


def last_boxed(text: str | None) -> str | None:
    """The content of the last ``\\boxed{…}`` (braces balanced) in ``text``, or None."""
    if not text:
        return None
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j].strip()
    return None


def math_equal(pred: str, gold: str) -> bool:
    """``pred`` equals ``gold`` mathematically (``1,000`` = ``1000``, ``\\frac{1}{2}`` = ``0.5``)."""
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    if len(pred) > MAX_ANSWER_CHARS:
        return False
    timeout = TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold_p = parse(f"\\boxed{{{gold}}}", parsing_timeout=timeout)
    pred_p = parse(f"\\boxed{{{pred}}}", parsing_timeout=timeout)
    return bool(gold_p and pred_p and verify(gold_p, pred_p, timeout_seconds=timeout))
