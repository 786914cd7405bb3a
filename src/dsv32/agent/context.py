"""Test-time context management (paper §4.4): what to do when the prompt outgrows the window.

The loop calls these when a step's prompt would exceed ``min(trigger · W, W − max_tokens)`` tokens
(the paper triggers at 80 % of the window ``W``; the reply's ``max_tokens`` stays free); the
:data:`UNMANAGED` baselines stop at ``W − max_tokens``. ``anchor`` is the index of the first
message after the task: everything before it (the system prompt, the task, any earlier conversation)
always stays. A *tool-call round* is an assistant message with ``tool_calls`` and the tool results
answering it, or a reply whose call could not be read and the loop's error message after it.

- ``summary``: the model summarizes the overflowed trajectory (:func:`summary_request`: the context,
  its reasoning as text in the request, the oldest tool results left out as far as needed to leave
  the summary its budget, :func:`fit_summary_request`); the rollout re-initiates from the task plus
  that summary (:func:`reinitiate`);
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

from collections.abc import Callable, Sequence

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
REASONING_HEADER = (
    "\n\nYour reasoning in the turns above, which this message hides from them, oldest first (use it too):"
)
OMITTED = "[output left out to fit the summary request]"
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


def kept_positions(messages: Sequence[dict], anchor: int, fraction: float) -> list[int]:
    """Positions of the messages that stay when the oldest rounds are discarded (``fraction=1``:
    every round)."""
    rounds = tool_rounds(messages, anchor)
    drop = rounds[: discarded_count(len(rounds), fraction)]
    gone = {i for start, end in drop for i in range(start, end)}
    return [i for i in range(len(messages)) if i not in gone]


def discard_rounds(messages: Sequence[dict], anchor: int, fraction: float) -> tuple[list[dict], int]:
    """``(context without the oldest rounds, number of messages removed)``; ``fraction=1`` removes all."""
    kept = kept_positions(messages, anchor, fraction)
    return [messages[i] for i in kept], len(messages) - len(kept)


def summary_parts(
    messages: Sequence[dict], anchor: int, thinking: bool = True
) -> tuple[list[int], list[int]]:
    """What :func:`summary_request` may leave out to fit, oldest first: the positions of the tool
    results at or after ``anchor`` and of the assistant turns whose reasoning the request carries
    (those after the last user message, in thinking mode: the reasoning the model could see)."""
    results = [i for i in range(anchor, len(messages)) if messages[i].get("role") == "tool"]
    start = max(anchor, last_user_index(messages) + 1)
    reasoned = [
        i
        for i in range(start, len(messages))
        if thinking and messages[i].get("role") == "assistant" and messages[i].get("reasoning_content")
    ]
    return results, reasoned


def summary_request(
    messages: Sequence[dict], anchor: int, thinking: bool = True, drop: int = 0
) -> tuple[list[dict], list[int]]:
    """``(the context plus the user message asking for a summary, positions of the tool results
    shown as OMITTED)``.

    The request is a user message, so §3.2.1 drops the reasoning of the turns before it from what
    the model sees; the request carries that reasoning as text instead (the summary is of the
    overflowed trajectory, reasoning included). ``drop`` leaves out the oldest ``drop`` parts of
    :func:`summary_parts` to make the prompt fit: tool results first (their content becomes
    :data:`OMITTED`), then the oldest turns' reasoning."""
    results, reasoned = summary_parts(messages, anchor, thinking)
    omitted = results[:drop]
    gone = set(omitted)
    out = [{**m, "content": OMITTED} if i in gone else m for i, m in enumerate(messages)]
    skipped = max(0, drop - len(results))
    text = SUMMARY_REQUEST
    if reasoned:
        text += REASONING_HEADER
        if skipped:
            text += f"\n\n(the reasoning of the first {skipped} of {len(reasoned)} turns is left out to fit)"
        for n, i in enumerate(reasoned[skipped:], start=skipped + 1):
            text += f"\n\n[turn {n}]\n{messages[i]['reasoning_content']}"
    return [*out, {"role": "user", "content": text}], omitted


def fit_summary_request(
    messages: Sequence[dict], anchor: int, thinking: bool, fits: Callable[[list[dict]], bool]
) -> tuple[list[dict], list[int], int] | None:
    """``(request, omitted tool results, parts left out)`` of :func:`summary_request` leaving out as
    few of the oldest parts as lets ``fits(request)`` hold (a binary search: O(log n) counts); None
    when even leaving out all of them does not fit."""
    results, reasoned = summary_parts(messages, anchor, thinking)
    low, high = 0, len(results) + len(reasoned)
    if not fits(summary_request(messages, anchor, thinking, high)[0]):
        return None
    while low < high:  # fits(high) holds; find the smallest such drop
        mid = (low + high) // 2
        if fits(summary_request(messages, anchor, thinking, mid)[0]):
            high = mid
        else:
            low = mid + 1
    request, omitted = summary_request(messages, anchor, thinking, high)
    return request, omitted, high


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
