"""Encode OpenAI-style message lists into the exact V3.2 prompt text.

Rules (``L`` = index of the last user or developer message, thinking mode unless said otherwise):

- **system**: its content, then ``\\n\\n`` + the tools block when it has ``tools``, then ``\\n\\n`` +
  the response-format block when it has ``response_format``. No role marker.
- **user**: ``<｜User｜>content<｜Assistant｜>`` then ``<think>`` for message L (the model is about
  to think) and ``</think>`` for earlier ones (their reasoning is gone). Chat mode: always
  ``</think>``.
- **developer**: a user turn whose text is the tools block, the response-format block and
  ``# The user's message is: content``.
- **assistant**: after L: ``reasoning</think>`` + content + DSML tool calls + EOS (the ``<think>``
  that opens it ends the previous turn). Before L, or in chat mode: content + tool calls + EOS.
- **tool**: the results answering one assistant turn are grouped in ``<function_results>`` with one
  ``<result>`` each, in order; after the last one ``<think>`` reopens thinking (at or after L) or
  ``</think>`` closes it (before L, chat mode).

The layout itself enforces the thinking context rule of §3.2.1
(:func:`~dsv32.chat.context.apply_thinking_context`): a turn before L has no place for reasoning.

:class:`IncrementalEncoder` encodes a conversation that changes from call to call (an agent's
growing context) to the same text, rendering only the messages that changed or whose layout did.

Deviations from DeepSeek's ``encoding_dsv32.py``, all on input it cannot encode correctly: a
developer message before the last user message is rendered as the user turn it is (there it is
dropped, which misaligns message indices and fails); ``tools`` on a user message, non-string
content, missing tool results before the next turn and non-finite numbers raise
:class:`ConversationError` instead of being ignored or written as ``None``/``NaN``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dsv32.chat import protocol as P
from dsv32.chat.context import USER_ROLES, apply_thinking_context, last_user_index
from dsv32.chat.errors import ConversationError
from dsv32.chat.snapshot import freeze, identical
from dsv32.chat.validate import (
    START,
    check_conversation,
    check_message,
    check_roles,
    check_thinking_mode,
    to_json,
    tool_call_arguments,
)


@dataclass(frozen=True)
class Segment:
    """A piece of the prompt: the text rendered for one message (``index`` None for the BOS)."""

    index: int | None
    role: str
    text: str

    @property
    def generated(self) -> bool:
        """True for text the model itself produced (assistant turns, up to and including EOS)."""
        return self.role == "assistant"


def tool_schemas_text(tools: Sequence[Mapping[str, Any]]) -> str:
    """One JSON object per line: the ``function`` part of each OpenAI tool."""
    return "\n".join(to_json(dict(tool["function"])) for tool in tools)


def render_tools(tools: Sequence[Mapping[str, Any]]) -> str:
    """The ``## Tools`` block: how to call tools, then the tool schemas."""
    return P.TOOLS_PROMPT_HEAD + tool_schemas_text(tools) + P.TOOLS_PROMPT_TAIL


def render_response_format(response_format: Mapping[str, Any]) -> str:
    return P.RESPONSE_FORMAT_HEAD + to_json(dict(response_format))


def render_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    """One DSML ``invoke``: strings are written raw (``string="true"``), other values as JSON."""
    params = []
    for key, value in arguments.items():
        is_str = isinstance(value, str)
        text = value if is_str else to_json(value)
        params.append(f'{P.PARAM_OPEN}{key}" string="{"true" if is_str else "false"}">{text}{P.PARAM_CLOSE}')
    return f'{P.INVOKE_OPEN}{name}">\n' + "\n".join(params) + f"\n{P.INVOKE_CLOSE}"


def _render_tool_calls(index: int, tool_calls: Sequence[Mapping[str, Any]]) -> str:
    if not tool_calls:
        return ""
    invokes = [
        render_tool_call(tc["function"]["name"], tool_call_arguments(index, k, tc))
        for k, tc in enumerate(tool_calls)
    ]
    return P.CALLS_START + "\n" + "\n".join(invokes) + "\n" + P.CALLS_CLOSE


def _system_blocks(message: Mapping[str, Any]) -> str:
    text = ""
    if message.get("tools"):
        text += "\n\n" + render_tools(message["tools"])
    if message.get("response_format"):
        text += "\n\n" + render_response_format(message["response_format"])
    return text


def _render_assistant(index: int, message: Mapping[str, Any], with_reasoning: bool) -> str:
    thinking = (message.get("reasoning_content") or "") + P.THINK_END if with_reasoning else ""
    content = message.get("content") or ""
    return thinking + content + _render_tool_calls(index, message.get("tool_calls") or []) + P.EOS


def _render_message(
    index: int, message: Mapping[str, Any], thinking: bool, last_user: int, calls: int, answered: int
) -> str:
    """The text of ``messages[index]``; ``calls``/``answered``: the tool calls of the assistant turn
    a tool result answers and the results so far, this one included."""
    role = message["role"]
    opens_thinking = thinking and index == last_user
    if role == "system":
        return (message.get("content") or "") + _system_blocks(message)
    if role == "user":
        return P.USER + message["content"] + P.ASSISTANT + (P.THINK_START if opens_thinking else P.THINK_END)
    if role == "developer":
        body = _system_blocks(message) + P.DEVELOPER_MESSAGE_PREFIX + message["content"]
        return P.USER + body + P.ASSISTANT + (P.THINK_START if opens_thinking else P.THINK_END)
    if role == "assistant":
        return _render_assistant(index, message, thinking and index > last_user)
    # tool (check_message guarantees a pending call)
    text = P.RESULTS_OPEN if answered == 1 else ""
    text += P.RESULT_OPEN + message["content"] + P.RESULT_CLOSE
    if answered == calls:
        reopen = thinking and index >= last_user
        text += P.RESULTS_CLOSE + "\n\n" + (P.THINK_START if reopen else P.THINK_END)
    return text


def _check_list(name: str, value: Any) -> None:
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        raise ConversationError(None, f"{name} must be a list of dicts, got {type(value).__name__}")


def render_segments(
    messages: Sequence[Mapping[str, Any]],
    thinking_mode: str = "thinking",
    context: Sequence[Mapping[str, Any]] | None = None,
    drop_thinking: bool = True,
    add_bos: bool = True,
) -> list[Segment]:
    """The prompt of :func:`encode_messages`, as one :class:`Segment` per rendered message."""
    for name, value in (("messages", messages), ("context", context or [])):
        _check_list(name, value)
    context = list(context or [])
    full = context + list(messages)
    check_conversation(full, thinking_mode)
    thinking = thinking_mode == "thinking"
    if thinking and drop_thinking:
        full = apply_thinking_context(full)
    last_user = last_user_index(full)

    segments: list[Segment] = []
    if add_bos and not context:
        segments.append(Segment(None, "bos", P.BOS))
    state = START
    for index, message in enumerate(full):
        state = next_state(index, message, state)
        if index >= len(context):
            text = _render_message(index, message, thinking, last_user, state[1], state[2])
            segments.append(Segment(index, message["role"], text))
    return segments


def next_state(index: int, message: Mapping[str, Any], state: tuple[int, int, int]) -> tuple[int, int, int]:
    """The tool-call state after ``message`` in a checked conversation (see
    :func:`~dsv32.chat.validate.check_message`)."""
    role = message["role"]
    if role == "assistant":
        return index, len(message.get("tool_calls") or []), 0
    if role == "tool":
        return state[0], state[1], state[2] + 1
    return START


# ------------------------------------------------------------------------------ incremental encoding
_UNCACHED = object()  # stands for a message that is never taken as unchanged (not a plain dict)


def _needs_strict(message: dict) -> bool:
    """Whether ``==`` can miss a change to how ``message`` is rendered: it has a tools list, a
    response format or tool-call arguments as an object (their key order and number types are written
    out), or text fields that are not plain strings."""
    if message.get("tools") or message.get("response_format"):
        return True
    for key in ("role", "content", "reasoning_content"):
        if type(message.get(key)) not in (str, type(None)):
            return True
    calls = message.get("tool_calls")
    if calls is None:
        return False
    if type(calls) is not list:
        return True
    for call in calls:
        function = call.get("function") if type(call) is dict else None
        if type(function) is not dict or type(function.get("arguments")) is not str:
            return True
        if type(function.get("name")) is not str:
            return True
    return False


@dataclass
class _Entry:
    """What the encoder keeps about one rendered message."""

    snapshot: Any  # a frozen copy of the message as given (_UNCACHED: never reused)
    strict: bool  # compare with identical() rather than ==
    prepared: Mapping[str, Any]  # what was rendered: prepare(message)
    segment: Segment
    state: tuple[int, int, int]  # the tool-call state after this message
    last_user: int  # the last user or developer message up to this one (-1: none)


class IncrementalEncoder:
    """:func:`encode_messages` for a conversation that grows call after call, rendering only what is
    new.

    Each call gets the whole conversation and returns the same text as :func:`encode_messages`, byte
    for byte. The encoder keeps a frozen copy of every message it rendered, with its checked state
    and its segment; a call re-renders from the first message that differs from its copy (changed in
    place or replaced, removed, inserted). When the last user or developer message moves (a new user
    turn: §3.2.1 drops the reasoning of the turns before it and closes their thinking; or history
    rewritten before it) the messages from the earlier of the two positions on are re-rendered too,
    since their layout depends on it. Everything before is reused without being checked again.

    Messages are compared with ``==`` against their copies; a message with a ``tools`` list, a
    ``response_format``, tool-call arguments given as a dict or text that is not a plain ``str`` is
    compared strictly (same types, same key order), since those are written out as they are. A
    message that is not a plain ``dict`` is rendered every time.

    ``prepare(message) -> message``, when given, is applied to each message after it is checked and
    before it is rendered (e.g. :func:`~dsv32.chat.untrusted.strip_tool_results` of it); it must
    depend on the message only. :attr:`reused` is how many leading segments of the latest result are
    the segment objects of the previous result (their text unchanged), e.g. to tokenize only the
    rest.
    """

    def __init__(
        self,
        thinking_mode: str = "thinking",
        add_bos: bool = True,
        prepare: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
    ) -> None:
        check_thinking_mode(thinking_mode)
        self.thinking_mode = thinking_mode
        self.add_bos = add_bos
        self.prepare = prepare
        # per rendered message, in parallel: what is kept, its frozen copy, its segment
        self._entries: list[_Entry] = []
        self._snapshots: list[Any] = []
        self._segments: list[Segment] = []
        self._strict: list[int] = []  # the messages compared with identical()
        self._rendered = False  # whether a call has returned segments
        self._bos = [Segment(None, "bos", P.BOS)] if add_bos else []
        self.reused = 0

    def _unchanged(self, messages: list[Any]) -> int:
        """How many leading messages equal their frozen copies."""
        entries, snapshots = self._entries, self._snapshots
        limit = min(len(messages), len(entries))
        try:
            same = messages[:limit] == snapshots[:limit]
        except Exception:  # an object whose comparison fails: find the first difference one by one
            same = False
        if same:
            for index in self._strict:
                if index < limit and not identical(messages[index], entries[index].snapshot):
                    return index
            return limit
        for index in range(limit):
            entry = entries[index]
            try:
                equal = (
                    identical(messages[index], entry.snapshot)
                    if entry.strict
                    else messages[index] == entry.snapshot
                )
            except Exception:
                equal = False
            if not equal:
                return index
        return limit

    def segments(self, messages: Sequence[Mapping[str, Any]]) -> list[Segment]:
        """The segments of :func:`render_segments` ``(messages, thinking_mode, add_bos=add_bos)``."""
        _check_list("messages", messages)
        messages = list(messages)
        entries = self._entries
        first = self._unchanged(messages)
        check_roles(messages, first)
        last_user = entries[first - 1].last_user if first else -1
        for index in range(len(messages) - 1, first - 1, -1):
            if messages[index]["role"] in USER_ROLES:
                last_user = index
                break
        old_last_user = entries[-1].last_user if entries else -1
        start = first if last_user == old_last_user else max(0, min(first, last_user, old_last_user))

        thinking = self.thinking_mode == "thinking"
        state = entries[start - 1].state if start else START
        seen = entries[start - 1].last_user if start else -1
        fresh: list[_Entry] = []
        for index in range(start, len(messages)):
            message = messages[index]
            state = check_message(index, messages, last_user, self.thinking_mode, state)
            if index < first:
                prepared = entries[index].prepared
            else:
                prepared = self.prepare(message) if self.prepare is not None else message
            text = _render_message(index, prepared, thinking, last_user, state[1], state[2])
            old = entries[index].segment if index < len(entries) else None
            if old is not None and old.role == message["role"] and old.text == text:
                segment = old
            else:
                segment = Segment(index, message["role"], text)
            if message["role"] in USER_ROLES:
                seen = index
            if index < first:
                snapshot, strict = entries[index].snapshot, entries[index].strict
            elif type(message) is dict:
                snapshot, strict = freeze(message), _needs_strict(message)
            else:
                snapshot, strict = _UNCACHED, False
            fresh.append(_Entry(snapshot, strict, prepared, segment, state, seen))

        old_segments = self._segments
        self._entries = entries[:start] + fresh
        self._snapshots = self._snapshots[:start] + [entry.snapshot for entry in fresh]
        self._segments = old_segments[:start] + [entry.segment for entry in fresh]
        self._strict = [i for i in self._strict if i < start]
        self._strict += [start + k for k, entry in enumerate(fresh) if entry.strict]
        reused = start
        limit = min(len(self._segments), len(old_segments))
        while reused < limit and self._segments[reused] is old_segments[reused]:
            reused += 1
        self.reused = len(self._bos) + reused if self._rendered else 0
        self._rendered = True
        return self._bos + self._segments

    def encode(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """:func:`encode_messages` ``(messages, thinking_mode, add_bos=add_bos)``."""
        return "".join(segment.text for segment in self.segments(messages))


def encode_messages(
    messages: Sequence[Mapping[str, Any]],
    thinking_mode: str = "thinking",
    context: Sequence[Mapping[str, Any]] | None = None,
    drop_thinking: bool = True,
    add_bos: bool = True,
) -> str:
    """Encode ``messages`` (OpenAI style) into the V3.2 prompt text.

    Args:
        messages: dicts with ``role`` in system, user, developer, assistant, tool; ``content``;
            ``tools`` / ``response_format`` on system or developer messages (see
            :func:`~dsv32.chat.context.attach_tools`); ``reasoning_content`` and ``tool_calls``
            (``[{"type": "function", "function": {"name", "arguments"}}]``, arguments a JSON object
            string or a dict) on assistant messages; tool results answer the preceding assistant
            turn's calls in order.
        thinking_mode: ``"thinking"`` (the model reasons inside ``<think>``) or ``"chat"``.
        context: messages already encoded; only ``messages`` are rendered, as they appear after
            ``context``. ``encode(context) + encode(new, context=context) == encode(context + new)``
            holds in chat mode and whenever ``new`` adds no user or developer message (a rollout
            appending assistant turns and tool results). A new user
            turn ends the round: by §3.2.1 earlier reasoning is dropped, which changes the prefix, so
            re-encode the whole conversation then (:class:`IncrementalEncoder` does this
            bookkeeping). In every case ``encode(new, context=context)`` is the exact tail of
            ``encode(context + new)``.
        drop_thinking: strip ``reasoning_content`` from assistant turns before the last user
            message before rendering (thinking mode). Kept for parity with DeepSeek's encoder: the
            released layout has no place for that reasoning, so the text is the same either way.
        add_bos: start with ``<｜begin▁of▁sentence｜>`` (only when ``context`` is empty).

    Raises:
        ConversationError: a ``ValueError`` naming the message index and the problem.
    """
    return "".join(s.text for s in render_segments(messages, thinking_mode, context, drop_thinking, add_bos))
