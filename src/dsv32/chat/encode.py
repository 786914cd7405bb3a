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

Deviations from DeepSeek's ``encoding_dsv32.py``, all on input it cannot encode correctly: a
developer message before the last user message is rendered as the user turn it is (there it is
dropped, which misaligns message indices and fails); ``tools`` on a user message, non-string
content, missing tool results before the next turn and non-finite numbers raise
:class:`ConversationError` instead of being ignored or written as ``None``/``NaN``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dsv32.chat import protocol as P
from dsv32.chat.context import apply_thinking_context, last_user_index
from dsv32.chat.errors import ConversationError
from dsv32.chat.validate import check_conversation, to_json, tool_call_arguments


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


def render_segments(
    messages: Sequence[Mapping[str, Any]],
    thinking_mode: str = "thinking",
    context: Sequence[Mapping[str, Any]] | None = None,
    drop_thinking: bool = True,
    add_bos: bool = True,
) -> list[Segment]:
    """The prompt of :func:`encode_messages`, as one :class:`Segment` per rendered message."""
    for name, value in (("messages", messages), ("context", context or [])):
        if not isinstance(value, Sequence) or isinstance(value, str | bytes):
            raise ConversationError(None, f"{name} must be a list of dicts, got {type(value).__name__}")
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
    calls = answered = 0
    for index, message in enumerate(full):
        role = message["role"]
        opens_thinking = thinking and index == last_user
        if role == "system":
            text = (message.get("content") or "") + _system_blocks(message)
        elif role == "user":
            text = P.USER + message["content"] + P.ASSISTANT
            text += P.THINK_START if opens_thinking else P.THINK_END
        elif role == "developer":
            body = _system_blocks(message) + P.DEVELOPER_MESSAGE_PREFIX + message["content"]
            text = P.USER + body + P.ASSISTANT + (P.THINK_START if opens_thinking else P.THINK_END)
        elif role == "assistant":
            calls, answered = len(message.get("tool_calls") or []), 0
            text = _render_assistant(index, message, thinking and index > last_user)
        else:  # tool (check_conversation guarantees a pending call)
            answered += 1
            text = P.RESULTS_OPEN if answered == 1 else ""
            text += P.RESULT_OPEN + message["content"] + P.RESULT_CLOSE
            if answered == calls:
                reopen = thinking and index >= last_user
                text += P.RESULTS_CLOSE + "\n\n" + (P.THINK_START if reopen else P.THINK_END)
        if index >= len(context):
            segments.append(Segment(index, role, text))
    return segments


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
            re-encode the whole conversation then. In every case ``encode(new, context=context)`` is
            the exact tail of ``encode(context + new)``.
        drop_thinking: strip ``reasoning_content`` from assistant turns before the last user
            message before rendering (thinking mode). Kept for parity with DeepSeek's encoder: the
            released layout has no place for that reasoning, so the text is the same either way.
        add_bos: start with ``<｜begin▁of▁sentence｜>`` (only when ``context`` is empty).

    Raises:
        ConversationError: a ``ValueError`` naming the message index and the problem.
    """
    return "".join(s.text for s in render_segments(messages, thinking_mode, context, drop_thinking, add_bos))
