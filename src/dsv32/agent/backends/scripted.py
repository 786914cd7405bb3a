"""A backend that plays given assistant messages: for tests, benchmarks and reference solutions.

``ScriptedBackend(replies)`` returns ``replies[0]``, ``replies[1]``, ... one per call. A reply is an
OpenAI-style assistant message (``content``, optional ``reasoning_content``, optional ``tool_calls``
with arguments as a JSON string or a dict, optional ``usage`` and ``finish_reason``), or a callable
``reply(messages, tools) -> message`` that sees what the model would see. Every call is recorded in
``calls`` (the messages, tools and thinking flag it was sent, as sent). When the script runs out,
the call raises :class:`~dsv32.agent.errors.BackendError` (the loop stops with ``"error"``).

Replies are read like an endpoint's (:func:`~dsv32.agent.backends.base.reply_message`): ``content``
a string, null or text parts; ``reasoning_content`` a string or null; ``tool_calls`` a list of
objects whose ``function`` is an object with a string (or null) ``name``; ``usage`` an object of
``prompt_tokens`` / ``completion_tokens`` / ``cached_tokens`` counts (``total_tokens`` is allowed); ``finish_reason`` a string.
A message given in the script that breaks these is refused when the backend is built
(:class:`~dsv32.agent.errors.AgentError`, naming the reply and the field); one a callable returns
is refused when it is played (``BackendError``: the episode stops with ``"error"``). Arguments that
are not a JSON object, a missing tool name: kept, and answered by the toolbox like any broken call.

Token counts use :class:`~dsv32.agent.backends.base.TokenEstimator` unless a reply carries ``usage``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from dsv32.agent.backends.base import (
    Completion,
    Delta,
    MalformedReply,
    TokenEstimator,
    Usage,
    at,
    optional_string,
    reply_message,
    reply_tokens,
    send_whole,
    token_count,
    wrong,
)
from dsv32.agent.errors import AgentError, BackendError

_USAGE_KEYS = ("prompt_tokens", "completion_tokens", "cached_tokens")


@dataclass
class ScriptedCall:
    messages: list[dict]
    tools: list[dict]
    thinking: bool
    sampling: dict | None


def scripted_reply(reply: Any) -> tuple[dict, Usage | None, str | None]:
    """``(assistant message, usage or None, finish reason or None)`` of one scripted reply; raises
    :class:`~dsv32.agent.backends.base.MalformedReply` naming what is wrong."""
    message = reply_message(reply)
    usage = reply.get("usage")
    if usage is not None:
        if not isinstance(usage, dict):
            raise wrong("usage", usage, "an object of token counts")
        unknown = sorted(set(usage) - {*_USAGE_KEYS, "total_tokens"}, key=str)
        if unknown:
            raise MalformedReply(f"usage has unknown keys {unknown}; it takes {', '.join(_USAGE_KEYS)}")
        token_count(usage.get("total_tokens"), "usage.total_tokens")  # OpenAI's; not kept
        usage = (
            Usage(**{k: token_count(usage.get(k), at("usage", k)) for k in _USAGE_KEYS}) if usage else None
        )
    return message, usage, optional_string(reply.get("finish_reason"), "finish_reason")


class ScriptedBackend:
    def __init__(self, replies: Sequence[dict | Callable[[list[dict], list[dict]], dict]]) -> None:
        if isinstance(replies, (str, bytes, dict)) or not isinstance(replies, Iterable):
            raise AgentError(
                f"a script is a list of assistant messages or callables, got {type(replies).__name__}"
            )
        self.replies = list(replies)
        for index, reply in enumerate(self.replies):
            if callable(reply):
                continue
            try:
                scripted_reply(reply)
            except MalformedReply as err:
                raise AgentError(f"scripted reply {index + 1}: {err}") from err
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
        try:
            if callable(reply):
                reply = reply(sent, list(tools))
            message, usage, finish = scripted_reply(reply)
        except MalformedReply as err:
            raise BackendError(f"scripted reply {index + 1}: {err}") from err
        send_whole(message, on_delta)
        if usage is None:
            usage = Usage(self.estimate(messages, tools), reply_tokens(message) + TokenEstimator.PER_MESSAGE)
        finish = finish or ("tool_calls" if message.get("tool_calls") else "stop")
        return Completion(message, usage, finish, time.perf_counter() - start)
