"""The code interpreter's verifier: the last ``\\boxed{…}`` of the final answer
(:func:`dsv32.envs.mathcheck.last_boxed`), checked against the task's answer with
:func:`dsv32.envs.mathcheck.answers_equal` — the same reading and comparison as the RL math reward
and the evaluation harness. The check is bounded by ``TIMEOUT_S`` in any thread (agents run episodes
in threads), and a boxed text longer than ``MAX_ANSWER_CHARS`` is not compared at all.
"""

from __future__ import annotations

from dsv32.envs.mathcheck import answers_equal, last_boxed

MAX_ANSWER_CHARS = 300
TIMEOUT_S = 5

__all__ = ["MAX_ANSWER_CHARS", "TIMEOUT_S", "last_boxed", "math_equal"]


def math_equal(pred: str, gold: str) -> bool:
    """``pred`` equals ``gold`` mathematically (``1,000`` = ``1000``, ``\\frac{1}{2}`` = ``0.5``)."""
    if len(pred) > MAX_ANSWER_CHARS:
        return False
    return answers_equal(pred, gold, timeout_seconds=TIMEOUT_S)
