"""The backend protocol: one model call from a conversation to one assistant message.

``backend.complete(messages, tools, thinking=..., sampling=..., on_delta=...)`` takes OpenAI-style
``messages`` (system, user, assistant with ``reasoning_content`` / ``tool_calls``, tool results),
OpenAI ``tools`` schemas, ``thinking`` (reason before answering) and per-call sampling settings, and
returns a :class:`Completion`: the assistant message, token usage, the finish reason (``"stop"``,
``"tool_calls"``, ``"length"``), the latency and any parse problems. ``on_delta(kind, text)``, if
given, receives the reply as it is produced (``kind`` is ``"reasoning"`` or ``"content"``).

``backend.count_tokens(messages, tools, thinking=...)`` is the prompt size the next call would have;
the loop's context management triggers on it. Backends that tokenize (local) count exactly; the
others estimate with :class:`TokenEstimator` (characters / 4, calibrated by the endpoint's usage).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from dsv32.chat import apply_thinking_context

Delta = Callable[[str, str], None]


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    #: Prompt tokens not computed again: reused KV cache (local) or the endpoint's cached tokens.
    cached_tokens: int = 0


@dataclass
class Completion:
    message: dict
    usage: Usage = field(default_factory=Usage)
    finish_reason: str | None = None
    latency_s: float = 0.0
    problems: list[dict] = field(default_factory=list)


class Backend(Protocol):
    def complete(
        self,
        messages: Sequence[dict],
        tools: Sequence[dict],
        *,
        thinking: bool = True,
        sampling: dict | None = None,
        on_delta: Delta | None = None,
    ) -> Completion: ...

    def count_tokens(
        self, messages: Sequence[dict], tools: Sequence[dict], *, thinking: bool = True
    ) -> int: ...


def assistant_message(content: Any, reasoning: Any = None, tool_calls: Any = None) -> dict:
    """A normalized assistant message: ``content`` a string, ``reasoning_content`` and ``tool_calls``
    only when present, tool calls as ``{"id", "type": "function", "function": {"name", "arguments"}}``
    with ``arguments`` a string (a dict is written as JSON)."""
    message: dict[str, Any] = {"role": "assistant", "content": content or ""}
    if reasoning:
        message["reasoning_content"] = reasoning
    calls = []
    for call in tool_calls or []:
        function = dict(call.get("function") or {})
        arguments = function.get("arguments")
        if isinstance(arguments, dict):
            arguments = json.dumps(arguments, ensure_ascii=False)
        entry = {"type": "function", "function": {"name": function.get("name"), "arguments": arguments}}
        if call.get("id"):
            entry = {"id": call["id"], **entry}
        calls.append(entry)
    if calls:
        message["tool_calls"] = calls
    return message


def visible_messages(messages: Sequence[dict], thinking: bool) -> list[dict]:
    """Copies of ``messages`` with the reasoning the model is shown: §3.2.1's thinking context in
    thinking mode, no ``reasoning_content`` at all in chat mode."""
    if thinking:
        return apply_thinking_context(messages)
    return [{k: v for k, v in m.items() if k != "reasoning_content"} for m in messages]


def message_chars(message: dict) -> int:
    """Characters of what a message puts in the prompt: text, reasoning, tool names and arguments."""
    n = len(message.get("content") or "") + len(message.get("reasoning_content") or "")
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        n += len(function.get("name") or "")
        n += len(arguments) if isinstance(arguments, str) else len(json.dumps(arguments, default=str))
    return n


def send_whole(message: dict, on_delta: Delta | None) -> None:
    """Pass a reply that arrived whole to ``on_delta``: its reasoning, then its content."""
    if on_delta is None:
        return
    for kind, key in (("reasoning", "reasoning_content"), ("content", "content")):
        if message.get(key):
            on_delta(kind, message[key])


def reply_tokens(message: dict) -> int:
    """Estimated tokens of a generated reply: its characters / 4, rounded up."""
    return math.ceil(message_chars(message) / TokenEstimator.CHARS_PER_TOKEN)


class TokenEstimator:
    """Prompt tokens ≈ ``scale · (chars / 4 + 4 per message + schema chars / 4)``.

    Incremental: the loop only appends to its context, so the estimate of a list whose first and
    last-counted messages are the same objects as last time adds only the new messages (each
    estimate costs O(new messages)). ``scale`` (1 by default) is set from an endpoint's reported
    usage with :meth:`calibrate`.
    """

    CHARS_PER_TOKEN = 4.0
    PER_MESSAGE = 4

    def __init__(self) -> None:
        self.scale = 1.0
        # the messages counted so far: their number, the first and the last (kept, so `is` holds),
        # and their raw estimate
        self._count = 0
        self._ends: tuple[dict, dict] | None = None
        self._total = 0.0
        self._tools_key: tuple[int, int] | None = None
        self._tools_raw = 0.0

    def raw(self, messages: Sequence[dict], tools: Sequence[dict]) -> float:
        key = (id(tools), len(tools))
        if key != self._tools_key:
            self._tools_key = key
            self._tools_raw = (
                len(json.dumps(list(tools), default=str)) / self.CHARS_PER_TOKEN if tools else 0.0
            )
        n = self._count
        same = 0 < n <= len(messages) and messages[0] is self._ends[0] and messages[n - 1] is self._ends[1]
        total = self._total if same else 0.0
        for message in messages[n if same else 0 :]:
            total += message_chars(message) / self.CHARS_PER_TOKEN + self.PER_MESSAGE
        self._count, self._total = len(messages), total
        self._ends = (messages[0], messages[-1]) if messages else None
        return total + self._tools_raw

    def __call__(self, messages: Sequence[dict], tools: Sequence[dict] = ()) -> int:
        return math.ceil(self.scale * self.raw(messages, tools))

    def calibrate(self, messages: Sequence[dict], tools: Sequence[dict], prompt_tokens: int) -> None:
        """Set ``scale`` so that the estimate of this prompt equals the reported ``prompt_tokens``."""
        raw = self.raw(messages, tools)
        if prompt_tokens > 0 and raw > 0:
            self.scale = prompt_tokens / raw
