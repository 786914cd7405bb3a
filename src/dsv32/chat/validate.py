"""Checks that a message list is a conversation V3.2 can encode; typed errors name the message.

What is checked: every message is a dict with a known role and string content where the role needs
one; ``tools``/``response_format`` only on system or developer messages, ``tool_calls`` and
``reasoning_content`` only on assistant messages; tool calls are OpenAI function calls whose
``arguments`` are a JSON object (a JSON string or a dict); tool results answer a preceding assistant
turn's calls, in order, no more results than calls, and all of them before the conversation moves
on (a conversation may *end* with results still pending: that is a prefix of a rollout); in thinking
mode an assistant turn after the last user message has reasoning or tool calls.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from dsv32.chat.context import last_user_index
from dsv32.chat.errors import ConversationError
from dsv32.chat.protocol import DSML, PARAM_CLOSE

ROLES = ("system", "user", "developer", "assistant", "tool")
THINKING_MODES = ("thinking", "chat")


def check_thinking_mode(thinking_mode: str) -> None:
    if thinking_mode not in THINKING_MODES:
        raise ValueError(f"thinking_mode must be 'thinking' or 'chat', got {thinking_mode!r}")


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def to_json(value: Any) -> str:
    """JSON as the released encoder writes it: ``json.dumps`` defaults, non-ASCII kept as is."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def tool_call_arguments(index: int, position: int, tool_call: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments of one OpenAI-style tool call as a dict (parsing the JSON string form)."""
    function = tool_call.get("function") if isinstance(tool_call, Mapping) else None
    if not isinstance(function, Mapping):
        raise ConversationError(index, f"tool call {position} has no `function` object (OpenAI format)")
    name = function.get("name")
    if not callable_name(name):
        raise ConversationError(
            index,
            f"tool call {position} needs a non-empty function name without quotes, newlines or DSML tags",
        )
    raw = function.get("arguments")
    if isinstance(raw, str):
        try:
            arguments = json.loads(raw, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as err:
            raise ConversationError(
                index, f"tool call {position} ({name}): arguments are not valid JSON ({err})"
            ) from err
    elif isinstance(raw, Mapping):
        arguments = dict(raw)
    else:
        raise ConversationError(
            index, f"tool call {position} ({name}): arguments must be a JSON object string or a dict"
        )
    if not isinstance(arguments, dict):
        raise ConversationError(
            index,
            f"tool call {position} ({name}): arguments must be a JSON object, got {type(arguments).__name__}",
        )
    for key, value in arguments.items():
        if not isinstance(key, str) or '"' in key or "\n" in key or DSML in key:
            raise ConversationError(
                index,
                f"tool call {position} ({name}): argument name {key!r} must be a string without quotes, "
                "newlines or DSML tags",
            )
        written = value
        if not isinstance(value, str):
            try:
                written = to_json(value)
            except (TypeError, ValueError, RecursionError) as err:
                raise ConversationError(
                    index, f"tool call {position} ({name}): argument {key!r} is not JSON-serializable ({err})"
                ) from err
        if PARAM_CLOSE in written:  # it would end the parameter early: the call could not be read back
            raise ConversationError(
                index,
                f"tool call {position} ({name}): argument {key!r} contains {PARAM_CLOSE!r}, which would end it early",
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise ConversationError(index, f"tool call {position} ({name}): argument {key!r} is not finite")
    return arguments


def _check_text(index: int, message: Mapping[str, Any], key: str, *, required: bool) -> None:
    value = message.get(key)
    if value is None and not required:
        return
    if not isinstance(value, str):
        what = "missing" if value is None else f"a {type(value).__name__}"
        raise ConversationError(
            index, f"`{key}` of a {message.get('role')} message must be a string, got {what}"
        )


def callable_name(name: Any) -> bool:
    """Whether ``name`` can stand in a V3.2 tool call: a non-empty string without quotes, newlines or
    DSML tags (the call's ``name="..."`` attribute must parse back)."""
    return isinstance(name, str) and bool(name) and '"' not in name and "\n" not in name and DSML not in name


def _check_tools(index: int, tools: Any) -> None:
    if not isinstance(tools, Sequence) or isinstance(tools, str):
        raise ConversationError(index, "`tools` must be a list of OpenAI function tools")
    names: set[str] = set()
    for position, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ConversationError(
                index, f"tool {position} must look like {{'type': 'function', 'function': {{'name': ...}}}}"
            )
        name = function["name"]
        if not callable_name(name):
            raise ConversationError(
                index,
                f"tool {position}: name {name!r} must be non-empty, without quotes, newlines or DSML tags",
            )
        if name in names:
            raise ConversationError(index, f"tool {position}: the name {name!r} is given twice")
        names.add(name)
        parameters = function.get("parameters")
        if parameters is not None and (
            not isinstance(parameters, Mapping) or not isinstance(parameters.get("properties", {}), Mapping)
        ):
            raise ConversationError(
                index,
                f"tool {position} ({name}): `parameters` must be a JSON Schema object with a properties object",
            )
        try:
            to_json(dict(function))
        except (TypeError, ValueError) as err:
            raise ConversationError(index, f"tool {position} is not JSON-serializable ({err})") from err


#: The state of :func:`check_message` before the first message: no tool calls are awaiting results.
#: ``(owner, calls, answered)``: the assistant message whose tool calls are being answered (-1 for
#: none), how many calls it made and how many results have come.
START = (-1, 0, 0)


def check_roles(messages: Sequence[Any], start: int = 0) -> None:
    """Every message from ``start`` on is a dict with a known role."""
    for index in range(start, len(messages)):
        message = messages[index]
        if not isinstance(message, Mapping):
            raise ConversationError(index, f"a message must be a dict, got {type(message).__name__}")
        role = message.get("role")
        if role not in ROLES:
            raise ConversationError(index, f"unknown role {role!r} (expected one of {', '.join(ROLES)})")


def check_message(
    index: int,
    messages: Sequence[Mapping[str, Any]],
    last_user: int,
    thinking_mode: str,
    state: tuple[int, int, int],
) -> tuple[int, int, int]:
    """Check ``messages[index]`` (its role already checked) given the :data:`START`-like ``state``
    after the messages before it; return the state after it."""
    owner, calls, answered = state
    message = messages[index]
    role = message["role"]
    if role != "tool" and answered < calls:
        raise ConversationError(
            index,
            f"a {role} message follows assistant message {owner}, which made {calls} tool calls "
            f"but got only {answered} results",
        )
    for key in ("tools", "response_format"):
        if message.get(key) and role not in ("system", "developer"):
            raise ConversationError(index, f"`{key}` belongs on a system or developer message, not {role}")
    for key in ("tool_calls", "reasoning_content"):
        if message.get(key) and role != "assistant":
            raise ConversationError(index, f"`{key}` belongs on an assistant message, not {role}")
    if message.get("tools"):
        _check_tools(index, message["tools"])
    if message.get("response_format") and not isinstance(message["response_format"], Mapping):
        raise ConversationError(index, "`response_format` must be a JSON object (a dict)")
    _check_text(index, message, "content", required=role in ("user", "developer", "tool"))
    if role == "developer" and not message["content"]:
        raise ConversationError(index, "a developer message needs non-empty content")
    if role == "assistant":
        _check_text(index, message, "reasoning_content", required=False)
        tool_calls = message.get("tool_calls") or []
        if not isinstance(tool_calls, Sequence) or isinstance(tool_calls, str):
            raise ConversationError(index, "`tool_calls` must be a list")
        for position, tool_call in enumerate(tool_calls):
            tool_call_arguments(index, position, tool_call)
        needs_reasoning = thinking_mode == "thinking" and index > last_user
        if needs_reasoning and not message.get("reasoning_content") and not tool_calls:
            raise ConversationError(
                index,
                "in thinking mode an assistant turn after the last user message needs "
                "`reasoning_content` or `tool_calls` (it is rendered as `reasoning</think>...`)",
            )
        return index, len(tool_calls), 0
    if role == "tool":
        if owner < 0 or calls == 0:
            raise ConversationError(index, "tool result with no preceding assistant tool call")
        if answered >= calls:
            raise ConversationError(
                index, f"more tool results than the {calls} tool calls of assistant message {owner}"
            )
        call_id = message.get("tool_call_id")
        ids = [tc.get("id") for tc in messages[owner]["tool_calls"]]
        if call_id is not None and any(ids) and call_id not in ids:
            raise ConversationError(
                index, f"tool_call_id {call_id!r} matches no tool call of assistant message {owner}"
            )
        return owner, calls, answered + 1
    return START


def check_conversation(messages: Sequence[Any], thinking_mode: str) -> None:
    """Raise :class:`ConversationError` (a ``ValueError``) for the first problem found."""
    check_thinking_mode(thinking_mode)
    if not isinstance(messages, Sequence) or isinstance(messages, str):
        raise ConversationError(None, f"messages must be a list of dicts, got {type(messages).__name__}")
    check_roles(messages)
    last_user = last_user_index(messages)
    state = START
    for index in range(len(messages)):
        state = check_message(index, messages, last_user, thinking_mode, state)


def unencodable(value: Any, steps: tuple = ()) -> tuple[tuple, bool, int, str] | None:
    """The first string in ``value`` (a JSON value: strings, list items, object keys and values) that
    UTF-8 cannot encode — a lone surrogate, which JSON's ``\\u`` escapes can carry — as ``(steps,
    is_key, position, character)``: ``steps`` the object keys and list indices that lead to it (to the
    object holding it, for a key), else None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            return steps, False, err.start, value[err.start]
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and (found := unencodable(key, steps)) is not None:
                return steps, True, found[2], found[3]
            if (found := unencodable(item, (*steps, key))) is not None:
                return found
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            if (found := unencodable(item, (*steps, index))) is not None:
                return found
    return None
