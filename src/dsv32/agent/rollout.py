"""One trajectory in the loop: the context the model is sent and where its messages sit in the
trajectory's transcript.

``traj.messages`` only grows; the context is what the next model call sees: after a ``discard_*``
reset it skips rounds of the transcript, after a ``summary`` reset it restarts from the initial
messages with the re-initiating task message, appended to the transcript when it is made.
``where[i]`` is the transcript index of ``context[i]``; ``spans`` are the same as ``[start, end)``
runs, which each :class:`~dsv32.agent.trajectory.Step` keeps as ``visible`` so the conversation the
model saw at every step can be rebuilt from the transcript
(:meth:`~dsv32.agent.trajectory.Trajectory.step_messages`).
"""

from __future__ import annotations

from collections.abc import Sequence

from dsv32.agent.trajectory import Trajectory


def spans_of(indices: Sequence[int]) -> list[list[int]]:
    """``[start, end)`` runs of consecutive indices, in order: ``[0, 1, 2, 7, 8] → [[0, 3], [7, 9]]``."""
    spans: list[list[int]] = []
    for i in indices:
        if spans and spans[-1][1] == i:
            spans[-1][1] += 1
        else:
            spans.append([i, i + 1])
    return spans


class Rollout:
    """The state of one trajectory: ``traj`` (the transcript and records), ``context`` (what the
    model is sent next), ``where`` and ``spans`` (see the module docstring), ``anchor`` (the number
    of initial messages: what context resets keep)."""

    def __init__(self, initial: list[dict], strategy: str) -> None:
        self.initial = initial
        self.traj = Trajectory(messages=list(initial), strategy=strategy)
        self.context = list(initial)
        self.where = list(range(len(initial)))
        self.spans = spans_of(self.where)
        self.anchor = len(initial)

    def add(self, message: dict) -> None:
        """Append ``message`` to the context and the transcript (O(1): the loop only appends)."""
        self.traj.messages.append(message)
        index = len(self.traj.messages) - 1
        self.context.append(message)
        self.where.append(index)
        if self.spans and self.spans[-1][1] == index:
            self.spans[-1][1] += 1
        else:
            self.spans.append([index, index + 1])

    def note(self, message: dict) -> int:
        """Append ``message`` to the transcript only (the summary request and reply); its index."""
        self.traj.messages.append(message)
        return len(self.traj.messages) - 1

    def visible(self) -> list[list[int]]:
        """The transcript spans of the context, as a step records them."""
        return [list(span) for span in self.spans]

    def keep(self, positions: Sequence[int]) -> None:
        """The context keeps only the messages at ``positions`` (a ``discard_*`` reset)."""
        self.context = [self.context[p] for p in positions]
        self.where = [self.where[p] for p in positions]
        self.spans = spans_of(self.where)

    def restart(self, fresh: list[dict], task: int) -> None:
        """The context becomes ``fresh`` (the initial messages, re-initiated), whose message
        ``task`` is new: it is appended to the transcript (a ``summary`` reset)."""
        self.where = list(range(len(fresh)))
        self.where[task] = self.note(fresh[task])
        self.context = list(fresh)
        self.spans = spans_of(self.where)
