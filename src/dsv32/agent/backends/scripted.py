"""A backend that plays given assistant messages: for tests, benchmarks and reference solutions.

``ScriptedBackend(replies)`` returns ``replies[0]``, ``replies[1]``, ... one per call. A reply is an
OpenAI-style assistant message (``content``, optional ``reasoning_content``, optional ``tool_calls``
with arguments as a JSON string or a dict, optional ``usage`` and ``finish_reason``), or a callable
``reply(messages, tools) -> message`` that sees what the model would see. Every call is recorded in
``calls`` (the messages, tools and thinking flag it was sent, as sent). When the script runs out,
the call raises :class:`~dsv32.agent.errors.BackendError` (the loop stops with ``"error"``).

Token counts use :class:`~dsv32.agent.backends.base.TokenEstimator` unless a reply carries ``usage``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dsv32.agent.backends.base import (
    Completion,
    Delta,
    TokenEstimator,
    Usage,
    assistant_message,
    reply_tokens,
    send_whole,
)
from dsv32.agent.errors import BackendError


@dataclass
class ScriptedCall:
    messages: list[dict]
    tools: list[dict]
    thinking: bool
    sampling: dict | None


class ScriptedBackend:
    def __init__(self, replies: Sequence[dict | Callable[[list[dict], list[dict]], dict]]) -> None:
        self.replies = list(replies)
        self.calls: list[ScriptedCall] = []
        self.estimate = TokenEstimator()

    @property
    def remaining(self) -> int:
        return len(self.replies) - len(self.calls)

    def count_tokens(self, messages: Sequence[dict], tools: Sequence[dict], *, thinking: bool = True) -> int:
        return self.estimate(messages, tools)

    def complete(
        self,
        messages: Sequence[dict],
        tools: Sequence[dict],
        *,
        thinking: bool = True,
        sampling: dict | None = None,
        on_delta: Delta | None = None,
    ) -> Completion:
        start = time.perf_counter()
        index = len(self.calls)
        if index >= len(self.replies):
            raise BackendError(f"the script has no reply {index + 1} (it holds {len(self.replies)})")
        sent = list(messages)
        self.calls.append(ScriptedCall(sent, list(tools), thinking, sampling))
        reply: Any = self.replies[index]
        if callable(reply):
            reply = reply(sent, list(tools))
        if not isinstance(reply, dict):
            raise BackendError(f"scripted reply {index + 1} must be an assistant message dict")
        message = assistant_message(
            reply.get("content"), reply.get("reasoning_content"), reply.get("tool_calls")
        )
        send_whole(message, on_delta)
        usage = reply.get("usage")
        usage = (
            Usage(**usage)
            if usage
            else Usage(self.estimate(messages, tools), reply_tokens(message) + TokenEstimator.PER_MESSAGE)
        )
        finish = reply.get("finish_reason") or ("tool_calls" if message.get("tool_calls") else "stop")
        return Completion(message, usage, finish, time.perf_counter() - start)
