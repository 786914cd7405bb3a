"""Thinking context management (paper §3.2.1) and attaching tools to a conversation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dsv32.chat.errors import ConversationError

#: Roles that open a new round: the user speaks. A developer message is rendered as a user turn.
USER_ROLES = ("user", "developer")


def last_user_index(messages: Sequence[Mapping[str, Any]]) -> int:
    """Index of the last ``user`` or ``developer`` message, or -1 when there is none."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") in USER_ROLES:
            return index
    return -1


def apply_thinking_context(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Drop the reasoning that V3.2 no longer shows the model; keep everything else.

    The rule (paper §3.2.1, Fig. 4):

    - ``reasoning_content`` of assistant turns **before the last user message** is removed;
    - reasoning of assistant turns **after** it is kept, across any number of tool rounds;
    - tool calls and tool results are always kept, whichever turn they belong to.

    Why: DeepSeek-R1 discarded the reasoning as soon as a second message arrived. With tools that
    forces the model to re-derive its whole plan after every tool result, which wastes tokens. V3.2
    therefore drops reasoning only when a new *user* message starts a new round; while the model is
    working through tool calls for the same request, its earlier reasoning stays in context. Tool
    calls and their results stay even when the reasoning goes, so the model still knows what it did
    and what it learned. (Frameworks that send tool results as *user* messages trigger the drop on
    every step; the paper recommends non-thinking mode for them.)

    :func:`~dsv32.chat.encode.encode_messages` lays the conversation out accordingly: user turns
    before the last one end with ``</think>`` and their assistant turns carry no reasoning.

    A ``developer`` message counts as a user message here (it is rendered as a user turn). Returns
    new message dicts (shallow copies); the input is not modified.
    """
    last_user = last_user_index(messages)
    kept: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        copy = dict(message)
        if copy.get("role") == "assistant" and index < last_user:
            copy.pop("reasoning_content", None)
        kept.append(copy)
    return kept


def attach_tools(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    response_format: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Put OpenAI-style ``tools`` (and a ``response_format``) where V3.2 renders them.

    They go onto the first message when it is a system message; otherwise an empty system message
    carrying them is inserted at the front (so the tool list is always part of the prompt, exactly as
    when a request passes ``tools`` next to ``messages``). The Jinja template applies the same rule
    to transformers' ``tools=`` argument. Returns a new list; raises :class:`ConversationError` when
    the system message already carries tools (or a response format) of its own.
    """
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ConversationError(index, f"a message must be a dict, got {type(message).__name__}")
    out = [dict(m) for m in messages]
    if not tools and not response_format:
        return out
    if tools and (not isinstance(tools, Sequence) or isinstance(tools, str | bytes)):
        raise ConversationError(
            None, f"tools must be a list of OpenAI function tools, got {type(tools).__name__}"
        )
    extra: dict[str, Any] = {}
    if tools:
        extra["tools"] = list(tools)
    if response_format:
        extra["response_format"] = dict(response_format)
    if out and out[0].get("role") == "system":
        for key in extra:
            if out[0].get(key):
                raise ConversationError(0, f"the system message already has `{key}`; pass them only once")
        out[0].update(extra)
    else:
        out.insert(0, {"role": "system", "content": "", **extra})
    return out


def conversation_from_json(data: Any) -> list[dict[str, Any]]:
    """Messages from a parsed JSON document: a list of messages, or an object with ``messages`` and
    optional ``tools`` / ``response_format`` (attached with :func:`attach_tools`), like the
    conformance fixture's ``test_input.json``."""
    if isinstance(data, list):
        return [dict(m) if isinstance(m, Mapping) else m for m in data]
    if isinstance(data, Mapping) and isinstance(data.get("messages"), list):
        return attach_tools(data["messages"], data.get("tools"), data.get("response_format"))
    raise ConversationError(None, "expected a JSON list of messages or an object with a `messages` list")
