"""Test-time context management (paper §4.4): what to do when the prompt outgrows the window.

The loop calls these when a step's prompt would exceed ``min(trigger · W, W − max_tokens)`` tokens
(the paper triggers at 80 % of the window ``W``; the reply's ``max_tokens`` stays free); the
:data:`UNMANAGED` baselines stop at ``W − max_tokens``. ``anchor`` is the index of the first
message after the task: everything before it (the system prompt, the task, any earlier conversation)
always stays. A *tool-call round* is an assistant message with ``tool_calls`` and the tool results
answering it, or a reply whose call could not be read and the loop's error message after it.

- ``summary``: the model summarizes the overflowed trajectory (:func:`summary_request`); the rollout
  re-initiates from the task plus that summary (:func:`reinitiate`);
- ``discard_75``: the oldest ``max(1, ⌊0.75 · n⌋)`` of the ``n`` rounds leave the context
  (:func:`discard_rounds`), the newer ones stay with their reasoning;
- ``discard_all``: every round leaves; the system prompt and the task stay (a fresh start that keeps
  nothing of what was learned, like a "new context" tool);
- ``parallel_fewest_step``: no reset; N independent trajectories run to the end (each stops when its
  prompt fills the window) and the finished one with the fewest steps wins (:func:`fewest_steps`) —
  the parallel-scaling baseline;
- ``none``: no reset; the episode stops with ``stop_reason="context"`` when the prompt fills the
  window (the no-management baseline).
"""

from __future__ import annotations

from collections.abc import Sequence

from dsv32.agent.errors import AgentError
from dsv32.chat import last_user_index

STRATEGIES = ("none", "summary", "discard_75", "discard_all", "parallel_fewest_step")
#: The baselines that never reset the context (§4.4): they stop when a prompt fills the window.
UNMANAGED = ("none", "parallel_fewest_step")
DEFAULT_TRIGGER = 0.8

SUMMARY_REQUEST = (
    "Your context is nearly full and will be reset. Write a summary of the work so far that lets you "
    "continue the task from the summary alone: what the task asks, what you found (facts, numbers, "
    "sources, intermediate results), what you tried that did not work, and what remains to be done. "
    "Do not call any tool; reply with the summary only."
)
SUMMARY_HEADER = (
    "\n\n## Summary of the work so far\n\n"
    "(Earlier steps were summarized to free context; continue the task from this summary.)\n\n"
)


def check_strategy(strategy: str) -> str:
    if strategy not in STRATEGIES:
        raise AgentError(f"unknown context strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    return strategy


def tool_rounds(messages: Sequence[dict], anchor: int) -> list[tuple[int, int]]:
    """``[start, end)`` spans of the tool-call rounds at or after ``anchor``, oldest first: an
    assistant message with its tool results, and the user message after them when one follows (the
    loop's error about a call that could not be read, which makes a round of a reply without calls
    too)."""
    rounds: list[tuple[int, int]] = []
    i, n = anchor, len(messages)
    while i < n:
        if messages[i].get("role") != "assistant":
            i += 1
            continue
        j = i + 1
        while j < n and messages[j].get("role") == "tool":
            j += 1
        if j < n and messages[j].get("role") == "user":
            j += 1
        if j > i + 1 or messages[i].get("tool_calls"):
            rounds.append((i, j))
        i = j
    return rounds


def discarded_count(n_rounds: int, fraction: float) -> int:
    """How many of ``n_rounds`` rounds ``discard`` removes: ``max(1, ⌊fraction · n⌋)``, at most n."""
    if n_rounds == 0:
        return 0
    return min(n_rounds, max(1, int(fraction * n_rounds)))


def discard_rounds(messages: Sequence[dict], anchor: int, fraction: float) -> tuple[list[dict], int]:
    """``(context without the oldest rounds, number of messages removed)``; ``fraction=1`` removes all."""
    rounds = tool_rounds(messages, anchor)
    drop = rounds[: discarded_count(len(rounds), fraction)]
    gone = {i for start, end in drop for i in range(start, end)}
    return [m for i, m in enumerate(messages) if i not in gone], len(gone)


def summary_request(messages: Sequence[dict]) -> list[dict]:
    """The context plus the user message asking for a summary."""
    return [*messages, {"role": "user", "content": SUMMARY_REQUEST}]


def reinitiate(initial: Sequence[dict], summary: str) -> list[dict]:
    """The initial messages with the summary appended to the task (the last user message)."""
    out = [dict(m) for m in initial]
    task = last_user_index(out)
    if task < 0:
        raise AgentError("the conversation has no user message to re-initiate from")
    out[task]["content"] = (out[task].get("content") or "") + SUMMARY_HEADER + summary
    return out


def fewest_steps(stop_reasons: Sequence[str], steps: Sequence[int]) -> int:
    """Index of the winner: the trajectory that answered in the fewest steps (the first on ties);
    when none answered, the first one."""
    answered = [i for i, reason in enumerate(stop_reasons) if reason == "answer"]
    if not answered:
        return 0
    return min(answered, key=lambda i: (steps[i], i))
