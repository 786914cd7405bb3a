"""The backend protocol: one model call from a conversation to one assistant message.

``backend.complete(messages, tools, thinking=..., sampling=..., on_delta=...)`` takes OpenAI-style
``messages`` (system, user, assistant with ``reasoning_content`` / ``tool_calls``, tool results),
OpenAI ``tools`` schemas, ``thinking`` (reason before answering) and per-call sampling settings, and
returns a :class:`Completion`: the assistant message, token usage, the finish reason (``"stop"``,
``"tool_calls"``, ``"length"``), the latency and any parse problems. ``on_delta(kind, text)``, if
given, receives the reply as it is produced (``kind`` is ``"reasoning"`` or ``"content"``).

``backend.count_tokens(messages, tools, thinking=...)`` is the prompt size the next call would have;
the loop's context management triggers on it. ``backend.reply_budget(sampling)`` (optional) is the
``max_tokens`` a call with those settings gets, None when unknown; the loop keeps that much of the
window free for the reply (without the method it reads ``max_tokens`` from the sampling settings). Backends that tokenize (local) count exactly; the
others estimate with :class:`TokenEstimator` (characters by kind, anchored to the endpoint's usage).

Replies that come from outside (an endpoint's JSON, a script) are read with :func:`reply_message`,
which checks every field it uses and raises :class:`MalformedReply` naming the first one that is
wrong; the backend turns that into its typed error. What the protocol fixes (an object where an
object belongs, strings and lists where they belong) must be right, or the reply is refused; what
the model wrote inside a tool call (a missing name, arguments that are not a JSON object) is kept
and answered by the toolbox, as every other broken call is.
"""

from __future__ import annotations

import json
import math
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from dsv32.agent.errors import AgentError
from dsv32.chat import apply_thinking_context

Delta = Callable[[str, str], None]

#: The sampling settings every backend takes, by the same names (OpenAI's, plus vLLM's ``top_k``),
#: in its constructor and per call. ``max_new_tokens`` is accepted as an alias of ``max_tokens``.
SAMPLING_KEYS = ("max_tokens", "temperature", "top_p", "top_k", "seed")


def one_budget(settings: dict) -> int | None:
    """The ``max_tokens`` of ``settings``, which may spell it ``max_tokens`` or ``max_new_tokens`` (None
    when neither is given); both with different values is an :class:`~dsv32.agent.errors.AgentError`."""
    given = {k: settings[k] for k in ("max_tokens", "max_new_tokens") if settings.get(k) is not None}
    if len(set(given.values())) > 1:
        raise AgentError(
            f"max_tokens={given['max_tokens']} and max_new_tokens={given['max_new_tokens']} disagree: "
            "give one (max_new_tokens is an alias of max_tokens)"
        )
    return int(next(iter(given.values()))) if given else None


def sampling_settings(settings: dict) -> dict:
    """``settings`` with the ``max_new_tokens`` alias written as ``max_tokens`` (see :func:`one_budget`)."""
    budget = one_budget(settings)
    out = {k: v for k, v in settings.items() if k != "max_new_tokens"}
    if budget is not None:
        out["max_tokens"] = budget
    return out


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


class MalformedReply(Exception):
    """A reply that is not an assistant message this protocol can read. Its text names the field and
    what was found (``tool_calls[0].function is a string ('add'), not an object``); backends turn it
    into :class:`~dsv32.agent.errors.BackendError` (a script given up front: ``AgentError``)."""


def describe(value: Any) -> str:
    """What a JSON value is, for error messages: ``a string ('add')``, ``an object``, ``missing or
    null`` (``None``: a key that is absent reads the same)."""
    if value is None:
        return "missing or null"
    if isinstance(value, bool):
        return f"a boolean ({value})"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, str):
        shown = value if len(value) <= 60 else value[:57] + "..."
        return f"a string ({shown!r})"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


def at(where: str, key: str | int) -> str:
    """The path of ``key`` inside ``where``: ``choices[0].message``, ``tool_calls[1]``."""
    if isinstance(key, int):
        return f"{where}[{key}]"
    return f"{where}.{key}" if where else key


def wrong(where: str, value: Any, expected: str) -> MalformedReply:
    """``where`` (a path, "" for the reply itself) is ``value``, not what was ``expected``."""
    found = "null" if value is None and where.endswith("]") else describe(value)  # a list item
    return MalformedReply(f"{where or 'the reply'} is {found}, not {expected}")


def reply_text(value: Any, where: str) -> str:
    """``content`` as a string: a string, null (``""``) or a list of text parts (joined)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for k, part in enumerate(value):
            text = part.get("text") if isinstance(part, dict) and part.get("type") == "text" else None
            if not isinstance(text, str):
                raise wrong(at(where, k), part, 'a text part {"type": "text", "text": "..."}')
            texts.append(text)
        return "".join(texts)
    raise wrong(where, value, "a string, null or a list of text parts")


def optional_string(value: Any, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise wrong(where, value, "a string or null")


def token_count(value: Any, where: str) -> int:
    """A usage count: a non-negative integer, or null/missing (0)."""
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise wrong(where, value, "a non-negative integer")


def arguments_text(value: Any, where: str) -> str:
    """A tool call's ``arguments`` as the string the protocol sends: a string as it is, null as
    ``"{}"``, any other JSON value (an object, a list, a number) written as JSON — the toolbox then
    answers the model when it is not an object."""
    if isinstance(value, str):
        return value
    if value is None:
        return "{}"
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as err:
        raise wrong(where, value, f"a JSON string or value ({err})") from err


def reply_tool_call(call: Any, where: str) -> dict:
    """One tool call, normalized to ``{"id"?, "type": "function", "function": {"name", "arguments"}}``.

    Refused: a call that is not an object, a ``function`` that is not an object, a ``name`` or
    ``id`` that is neither a string nor null. Kept for the toolbox to answer (the model's mistakes):
    a null or missing name (``""``, an unknown tool), arguments that are not a JSON object."""
    if not isinstance(call, dict):
        raise wrong(where, call, "a tool call object")
    function = call.get("function")
    if not isinstance(function, dict):
        raise wrong(at(where, "function"), function, 'an object {"name": ..., "arguments": ...}')
    name = optional_string(function.get("name"), at(at(where, "function"), "name")) or ""
    arguments = arguments_text(function.get("arguments"), at(at(where, "function"), "arguments"))
    call_id = optional_string(call.get("id"), at(where, "id"))
    entry = {"type": "function", "function": {"name": name, "arguments": arguments}}
    return {"id": call_id, **entry} if call_id else entry


def reply_tool_calls(value: Any, where: str) -> list[dict]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise wrong(where, value, "a list of tool calls or null")
    return [reply_tool_call(call, at(where, k)) for k, call in enumerate(value)]


def reply_message(data: Any, where: str = "", reasoning_keys: Sequence[str] = ("reasoning_content",)) -> dict:
    """The assistant message in a reply (a parsed JSON object), normalized like
    :func:`assistant_message`; raises :class:`MalformedReply` naming what is wrong (see the module
    docstring). The reasoning is the first non-empty of ``reasoning_keys``."""
    if not isinstance(data, dict):
        raise wrong(where or "the message", data, "an assistant message object")
    content = reply_text(data.get("content"), at(where, "content"))
    reasoning = ""
    for key in reasoning_keys:
        reasoning = reasoning or optional_string(data.get(key), at(where, key)) or ""
    calls = reply_tool_calls(data.get("tool_calls"), at(where, "tool_calls"))
    return assistant_message(content, reasoning, calls)


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


_DIGITS = str.maketrans("", "", string.digits)
_SYMBOLS = str.maketrans("", "", string.punctuation)


def text_tokens(text: str) -> float:
    """Estimated tokens of ``text``, on the high side for the tokenizers of chat models: 0.3 per
    letter or space (English prose is 3.2-4.5 characters a token), 1 per digit (Llama-family
    tokenizers split numbers into digits), 0.8 per ASCII symbol and 2 per other character (byte-level
    BPE spends 1-3 tokens on a CJK character). Measured with SmolLM2's tokenizer: prose 1.2×, code
    1.5×, JSON 1.1×, digits and tables of numbers 0.95-1×, CJK 1.1×; random base64 is
    under-counted (0.5×) — no per-character rule covers it without counting prose several times
    over."""
    n = len(text)
    if n == 0:
        return 0.0
    digits = n - len(text.translate(_DIGITS))
    symbols = n - len(text.translate(_SYMBOLS))
    other = 0 if text.isascii() else n - len(text.encode("ascii", "ignore"))
    return 0.3 * (n - digits - symbols - other) + digits + 0.8 * symbols + 2.0 * other


def message_text(message: dict) -> str:
    """What a message puts in the prompt: text, reasoning, tool names and arguments."""
    parts = [message.get("content") or "", message.get("reasoning_content") or ""]
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        parts.append(function.get("name") or "")
        parts.append(arguments if isinstance(arguments, str) else json.dumps(arguments, default=str))
    return "".join(p if isinstance(p, str) else str(p) for p in parts)


def send_whole(message: dict, on_delta: Delta | None) -> None:
    """Pass a reply that arrived whole to ``on_delta``: its reasoning, then its content."""
    if on_delta is None:
        return
    for kind, key in (("reasoning", "reasoning_content"), ("content", "content")):
        if message.get(key):
            on_delta(kind, message[key])


def reply_tokens(message: dict) -> int:
    """Estimated tokens of a generated reply (:func:`text_tokens`), rounded up."""
    return math.ceil(text_tokens(message_text(message)))


class TokenEstimator:
    """Prompt tokens of an endpoint that does not count them for us.

    Before the endpoint has reported a count: ``text_tokens + 4 per message + schema tokens``
    (:func:`text_tokens` errs high). After :meth:`calibrate` (the endpoint's ``usage.prompt_tokens``
    of a prompt): a list that extends that prompt is its reported count plus the estimate of the
    messages added since (the reply and the tool results: the only part estimated, and not scaled,
    since the reported count also holds the template's fixed text); any other list (a context
    reset) is ``scale`` times its estimate, ``scale`` being the reported count over the estimate of
    the calibrated prompt.

    Incremental: the loop only appends to its context, so the estimate of a list whose first and
    last-counted messages are the same objects as last time adds only the new messages (each
    estimate costs O(new messages)).
    """

    PER_MESSAGE = 4

    def __init__(self) -> None:
        self.scale = 1.0
        # the messages counted so far: their number, the first and the last (kept, so `is` holds),
        # and their estimate
        self._count = 0
        self._ends: tuple[dict, dict] | None = None
        self._total = 0.0
        self._tools_key: tuple[int, int] | None = None  # the schemas counted (None: no tools)
        self._tools_raw = 0.0
        # the calibrated prompt: (messages, first, last, tools key, reported tokens, their estimate)
        self._known: tuple[int, dict, dict, tuple[int, int] | None, int, float] | None = None

    def raw(self, messages: Sequence[dict], tools: Sequence[dict]) -> float:
        key = (id(tools), len(tools)) if tools else None
        if key != self._tools_key:
            self._tools_key = key
            self._tools_raw = text_tokens(json.dumps(list(tools), default=str)) if tools else 0.0
        n = self._count
        same = 0 < n <= len(messages) and messages[0] is self._ends[0] and messages[n - 1] is self._ends[1]
        total = self._total if same else 0.0
        for message in messages[n if same else 0 :]:
            total += text_tokens(message_text(message)) + self.PER_MESSAGE
        self._count, self._total = len(messages), total
        self._ends = (messages[0], messages[-1]) if messages else None
        return total + self._tools_raw

    def __call__(self, messages: Sequence[dict], tools: Sequence[dict] = ()) -> int:
        raw = self.raw(messages, tools)
        known = self._known
        if known is not None:
            n, first, last, key, tokens, counted = known
            if (
                key == self._tools_key
                and 0 < n <= len(messages)
                and messages[0] is first
                and messages[n - 1] is last
            ):
                return math.ceil(tokens + self._total - counted)
        return math.ceil(self.scale * raw)

    def calibrate(self, messages: Sequence[dict], tools: Sequence[dict], prompt_tokens: int) -> None:
        """Take ``prompt_tokens`` as the size of this prompt (the endpoint's count)."""
        raw = self.raw(messages, tools)
        if prompt_tokens > 0 and raw > 0 and messages:
            self.scale = prompt_tokens / raw
            self._known = (
                len(messages),
                messages[0],
                messages[-1],
                self._tools_key,
                prompt_tokens,
                self._total,
            )
