"""What an episode leaves behind: the conversation, the answer, and one record per model call.

A :class:`Trajectory` is what :meth:`dsv32.agent.Agent.run` returns and what an environment's
verifier scores (it satisfies :class:`dsv32.envs.base.TrajectoryLike`: ``messages`` and ``final``).

- ``messages``: the whole episode, OpenAI-style and append-only: the initial messages (system, task),
  every assistant turn (``content``, ``reasoning_content``, ``tool_calls`` with ids), every tool
  result (``{"role": "tool", "tool_call_id", "content"}``) and, after a reply that attempted a tool
  call that could not be read, the user message telling the model so. A ``summary`` reset appends
  the summary request, the summary (without tool calls: they are not run) and the user message
  that re-initiates the rollout, so the list stays a valid conversation; discarded rounds stay here
  (they leave only the model's context, see ``context_events``). Each step's ``visible`` spans say
  which of these messages its prompt held (:meth:`Trajectory.step_messages`).
- ``steps``: one :class:`Step` per model call (``kind="summary"`` for the summarization calls of the
  ``summary`` strategy), with token usage, latency, finish reason, parse problems, the tool calls and
  the error sent about a call that could not be read.
- ``context_events``: every context reset (step, strategy, prompt tokens before and after).
- ``total_steps`` / ``total_tokens``: what the episode spent, every thread of
  ``parallel_fewest_step`` included, so strategies compare at equal budget.

:meth:`Trajectory.write_jsonl` writes one JSON line per step (the log format of ``dsv32 agent run``).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


def write_text_atomically(path: str | Path, lines: Iterable[str]) -> Path:
    """Write ``lines`` to ``path`` through a temporary file in the same directory, renamed over it at
    the end: a failure leaves the previous file (or none), never a partial one.

    Text is UTF-8; a lone surrogate (bytes decoded with ``surrogateescape``, as ``os.listdir`` or a
    subprocess give them) cannot be encoded and is written as its ``\\udcXX`` escape, which inside a
    JSON string reads back as the same character."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8", errors="backslashreplace") as f:
            f.writelines(lines)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


@dataclass
class ToolRecord:
    """One executed tool call: ``ok`` False with ``error`` the kind (``unknown_tool``, ``bad_json``,
    ``invalid_arguments``, ``exception``, ``timeout``); ``truncated`` when the output was cut."""

    name: str
    call_id: str
    ok: bool
    error: str | None = None
    latency_s: float = 0.0
    output_chars: int = 0
    truncated: bool = False


@dataclass
class ContextEvent:
    """A context reset before model call ``step``: ``tokens_before`` > the limit,
    ``tokens_after`` the prompt that replaced it; ``removed`` messages left the context.

    ``summary`` strategy: ``summary`` is the text the rollout re-initiated with;
    ``summary_truncated`` when it was cut at its token budget (the cut text is used);
    ``left_out`` how many of the oldest tool results and reasonings the summarizer's prompt left
    out to leave the summary its budget; ``fallback="discard_all"`` when even without them it could
    not fit (or the endpoint refused it), and the reset was discard_all's."""

    step: int
    strategy: str
    tokens_before: int
    tokens_after: int
    removed: int = 0
    summary: str | None = None
    summary_truncated: bool = False
    left_out: int = 0
    fallback: str | None = None


@dataclass
class Step:
    """One model call. ``cached_tokens``: prompt tokens whose keys/values were reused (local backend)
    or that the endpoint reported as cached; ``latency_s`` the model call, ``tool_latency_s`` the tools."""

    index: int
    kind: str = "act"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    latency_s: float = 0.0
    tool_latency_s: float = 0.0
    finish_reason: str | None = None
    tool_calls: list[ToolRecord] = field(default_factory=list)
    context_events: list[ContextEvent] = field(default_factory=list)
    problems: list[dict] = field(default_factory=list)
    thread: int = 0
    #: The error message the model was sent when its reply attempted a tool call that could not be
    #: read (see :mod:`dsv32.agent.replies`); None otherwise.
    call_error: str | None = None
    #: What the model was sent: ``[start, end)`` spans of the trajectory's ``messages``, in order
    #: (see :meth:`Trajectory.step_messages`).
    visible: list[list[int]] = field(default_factory=list)
    #: Indices of tool results the model saw as :data:`~dsv32.agent.context.OMITTED` (summary calls).
    omitted: list[int] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def log_line(self) -> dict[str, Any]:
        """The JSONL record of this step."""
        return {
            "step": self.index,
            "thread": self.thread,
            "kind": self.kind,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "latency_s": round(self.latency_s, 6),
            "tool_latency_s": round(self.tool_latency_s, 6),
            "finish_reason": self.finish_reason,
            "tools": [
                {"name": t.name, "ok": t.ok, "error": t.error, "truncated": t.truncated}
                for t in self.tool_calls
            ],
            "context_events": [asdict(e) for e in self.context_events],
            "problems": self.problems,
            "call_error": self.call_error,
        }


@dataclass
class ThreadSummary:
    """One trajectory of ``parallel_fewest_step``: how it ended and what it spent."""

    thread: int
    stop_reason: str
    steps: int
    tokens: int
    final: str | None


@dataclass
class Trajectory:
    messages: list[dict]
    final: str | None = None
    steps: list[Step] = field(default_factory=list)
    stop_reason: str = "max_steps"
    context_events: list[ContextEvent] = field(default_factory=list)
    strategy: str = "none"
    error: str | None = None
    threads: list[ThreadSummary] = field(default_factory=list)
    #: Budget of every thread (parallel_fewest_step) or of this one; set by the loop.
    total_steps: int = 0
    total_tokens: int = 0

    @property
    def prompt_tokens(self) -> int:
        return sum(s.prompt_tokens for s in self.steps)

    @property
    def completion_tokens(self) -> int:
        return sum(s.completion_tokens for s in self.steps)

    def step_messages(self, index: int) -> list[dict]:
        """The conversation model call ``index`` was sent, rebuilt from ``messages``: its ``visible``
        spans, with the tool results it saw left out as such (the backend then applies §3.2.1's
        thinking context, as for any conversation)."""
        from dsv32.agent.context import OMITTED

        step = self.steps[index]
        gone = set(step.omitted)
        return [
            {**self.messages[i], "content": OMITTED} if i in gone else self.messages[i]
            for start, end in step.visible
            for i in range(start, end)
        ]

    @property
    def num_steps(self) -> int:
        """Model calls of this trajectory (summary calls included)."""
        return len(self.steps)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        steps = [
            Step(
                **{
                    **s,
                    "tool_calls": [ToolRecord(**t) for t in s.get("tool_calls", [])],
                    "context_events": [ContextEvent(**e) for e in s.get("context_events", [])],
                }
            )
            for s in data.get("steps", [])
        ]
        return cls(
            **{
                **data,
                "steps": steps,
                "context_events": [ContextEvent(**e) for e in data.get("context_events", [])],
                "threads": [ThreadSummary(**t) for t in data.get("threads", [])],
            }
        )

    def save(self, path: str | Path) -> Path:
        """The whole trajectory as one JSON document (written atomically, see
        :func:`write_text_atomically`; :meth:`load` gives back an equal trajectory)."""
        return write_text_atomically(path, [json.dumps(self.to_dict(), ensure_ascii=False, indent=1)])

    @classmethod
    def load(cls, path: str | Path) -> Trajectory:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def write_jsonl(self, path: str | Path) -> Path:
        """One line per step (see :meth:`Step.log_line`), then a last line ``{"episode": ...}`` with
        the stop reason, the answer and the totals (written atomically)."""
        summary = {
            "episode": {
                "stop_reason": self.stop_reason,
                "final": self.final,
                "strategy": self.strategy,
                "error": self.error,
                "steps": self.num_steps,
                "total_steps": self.total_steps,
                "total_tokens": self.total_tokens,
                "resets": len(self.context_events),
                "threads": [asdict(t) for t in self.threads],
            }
        }
        records = [*(step.log_line() for step in self.steps), summary]
        return write_text_atomically(path, (json.dumps(r, ensure_ascii=False) + "\n" for r in records))
