"""Parse a V3.2 completion (the text generated after the prompt) back into an assistant message.

The grammar is exactly what :func:`~dsv32.chat.encode.encode_messages` writes for an assistant turn
after the last user message::

    thinking mode:  REASONING </think> CONTENT [CALLS] <｜end▁of▁sentence｜>
    chat mode:                         CONTENT [CALLS] <｜end▁of▁sentence｜>
    CALLS    = "\\n\\n<｜DSML｜function_calls>\\n" INVOKE ("\\n" INVOKE)* "\\n</｜DSML｜function_calls>"
    INVOKE   = '<｜DSML｜invoke name="NAME">\\n' PARAM ("\\n" PARAM)* "\\n</｜DSML｜invoke>"   (0+ params)
    PARAM    = '<｜DSML｜parameter name="KEY" string="true|false">VALUE</｜DSML｜parameter>'

``string="true"`` values are taken verbatim; ``string="false"`` values must be JSON (finite numbers),
and ``arguments`` is re-serialized with ``json.dumps`` (DeepSeek's parser splices the raw text; the
two agree on everything the encoder writes). REASONING and CONTENT may not contain special tokens or
DSML tags (also ``<｜User｜>``/``<｜Assistant｜>``, which DeepSeek's parser does not check).

Strict mode (the default) raises :class:`~dsv32.chat.errors.ParseError` at the first deviation, with
its position and what was expected; no other exception escapes. Lenient mode (``strict=False``) is
for RL and agents: it returns what it could recover -- reasoning cut at max tokens, a missing end
token, the complete tool calls before a broken one -- and lists every problem under ``problems``.
"""

from __future__ import annotations

import json
from typing import Any

from dsv32.chat import protocol as P
from dsv32.chat.errors import ParseError
from dsv32.chat.validate import check_thinking_mode, to_json


class _Abandon(Exception):
    """Internal (lenient mode): stop parsing the tool-call block; the problem is already recorded."""


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


class _Parser:
    def __init__(self, text: str, strict: bool) -> None:
        self.text = text
        self.strict = strict
        self.pos = 0
        self.part = "reasoning"  # the part being read, recorded with each problem
        self.problems: list[ParseError] = []

    # --- failure handling ---
    def fail(self, position: int, expected: str) -> None:
        """Strict: raise. Lenient: record and let the caller recover."""
        found = self.text[position : position + 24]
        error = ParseError(position, expected, found, self.part)
        if self.strict:
            raise error
        self.problems.append(error)

    def abandon(self, position: int, expected: str) -> None:
        self.fail(position, expected)
        raise _Abandon

    # --- low-level reading ---
    def expect(self, literal: str) -> None:
        if not self.text.startswith(literal, self.pos):
            self.abandon(self.pos, repr(literal))
        self.pos += len(literal)

    def read_until(self, delimiter: str, what: str) -> str:
        end = self.text.find(delimiter, self.pos)
        if end < 0:
            self.abandon(len(self.text), f"{delimiter!r} ending the {what}")
        value = self.text[self.pos : end]
        self.pos = end + len(delimiter)
        return value

    def check_plain_text(self, start: int, value: str, what: str) -> None:
        for token in P.FORBIDDEN_IN_TEXT:
            found = value.find(token)
            if found >= 0:
                self.fail(start + found, f"{what} without the special marker {token!r}")

    # --- grammar ---
    def reasoning(self) -> str:
        text = self.text
        stops = [i for i in (text.find(P.CALLS_START), text.find(P.EOS)) if i >= 0]
        end = text.find(P.THINK_END)
        if end >= 0 and all(end < stop for stop in stops):
            self.pos = end + len(P.THINK_END)
            value = text[:end]
        else:
            stop = min(stops, default=len(text))
            self.fail(stop, f"{P.THINK_END!r} closing the reasoning")
            self.pos = stop
            value = text[:stop]
        self.check_plain_text(0, value, "reasoning")
        return value

    def content(self) -> tuple[str, bool]:
        """The answer text; True when a tool-call block follows."""
        self.part = "content"
        text, start = self.text, self.pos
        calls = text.find(P.CALLS_START, start)
        eos = text.find(P.EOS, start)
        if calls >= 0 and (eos < 0 or calls < eos):
            self.pos = calls + 2  # at "<｜DSML｜function_calls>"
            value, has_calls = text[start:calls], True
        elif eos >= 0:
            self.pos = eos
            value, has_calls = text[start:eos], False
        else:
            self.pos = len(text)
            value, has_calls = text[start:], False
        self.check_plain_text(start, value, "content")
        return value, has_calls

    def parameter(self, arguments: dict[str, Any]) -> None:
        self.expect(P.PARAM_OPEN)
        key_at = self.pos
        key = self.read_until('" string="', "parameter name")
        if '"' in key or "\n" in key or P.DSML in key:
            self.abandon(key_at, "a parameter name (no quotes, newlines or DSML tags)")
        if key in arguments:
            self.abandon(key_at, f"a new parameter name ({key!r} was already given)")
        if self.text.startswith('true">', self.pos):
            is_str = True
        elif self.text.startswith('false">', self.pos):
            is_str = False
        else:
            self.abandon(self.pos, "'true\">' or 'false\">' (the string attribute)")
        self.pos += len('true">') if is_str else len('false">')
        value_at = self.pos
        raw = self.read_until(P.PARAM_CLOSE, "parameter value")
        if is_str:
            arguments[key] = raw
            return
        try:
            value = json.loads(raw, parse_constant=_reject_constant)
            to_json(value)  # rejects what JSON cannot hold, e.g. 1e400 (inf)
            arguments[key] = value
        except (ValueError, RecursionError):
            self.part = "arguments"  # the call is still read, with this value as a string
            self.fail(value_at, f'a JSON value for parameter {key!r} (string="false")')
            self.part = "tool_calls"
            arguments[key] = raw  # lenient: keep the text as a string

    def invoke(self) -> dict[str, Any]:
        self.expect(P.INVOKE_OPEN)
        name_at = self.pos
        name = self.read_until('">\n', "tool name")
        if not name or '"' in name or "\n" in name or P.DSML in name:
            self.abandon(name_at, "a tool name (no quotes, newlines or DSML tags)")
        arguments: dict[str, Any] = {}
        if not self.text.startswith("\n" + P.INVOKE_CLOSE, self.pos):
            while True:
                self.parameter(arguments)
                if self.text.startswith("\n" + P.PARAM_OPEN, self.pos):
                    self.pos += 1
                    continue
                break
        self.expect("\n" + P.INVOKE_CLOSE)
        try:
            encoded = to_json(arguments)
        except RecursionError:  # every value re-encoded alone; only extreme nesting gets here
            self.abandon(name_at, "arguments nested shallowly enough to write as JSON")
        return {"type": "function", "function": {"name": name, "arguments": encoded}}

    def tool_calls(self) -> list[dict[str, Any]]:
        self.part = "tool_calls"
        calls: list[dict[str, Any]] = []
        try:
            self.expect(P.CALLS_OPEN + "\n")
            while True:
                calls.append(self.invoke())
                if self.text.startswith("\n" + P.INVOKE_OPEN, self.pos):
                    self.pos += 1
                    continue
                self.expect("\n" + P.CALLS_CLOSE)
                break
        except _Abandon:
            # Lenient: keep the complete calls, skip to the end token (or the end of the text).
            eos = self.text.find(P.EOS, self.pos)
            self.pos = eos if eos >= 0 else len(self.text)
        return calls

    def end(self) -> None:
        self.part = "end"
        text = self.text
        if text.startswith(P.EOS, self.pos):
            self.pos += len(P.EOS)
        else:
            eos = text.find(P.EOS, self.pos)
            expected = f"the end token {P.EOS!r}"
            if eos < 0:
                self.fail(self.pos, expected + " (the completion may have been cut at max tokens)")
                self.pos = len(text)
                return
            self.fail(self.pos, expected + " right after the tool calls")
            self.pos = eos + len(P.EOS)
        if self.pos != len(text):
            self.fail(self.pos, "nothing after the end token")


def parse_completion(text: str, thinking_mode: str = "thinking", *, strict: bool = True) -> dict[str, Any]:
    """Turn a completion back into ``{"role": "assistant", "content", "reasoning_content", "tool_calls"}``.

    ``tool_calls`` is a list of ``{"type": "function", "function": {"name", "arguments"}}`` with
    ``arguments`` a JSON object string; ``reasoning_content`` is ``""`` in chat mode. ``text`` is what
    the model generated after the prompt (the prompt ends with ``<think>`` in thinking mode), up to and
    including ``<｜end▁of▁sentence｜>``.

    Strict (default): any deviation raises :class:`ParseError` (a ``ValueError``) with ``position``
    and ``expected``. Lenient (``strict=False``): never raises for malformed text; the result also has
    ``problems``, a list of ``{"position", "expected", "message", "part"}`` (empty for a clean
    completion); ``part`` says where: ``"reasoning"``, ``"content"``, ``"tool_calls"`` (the tool-call
    block could not be read from there on: the calls from there are lost), ``"arguments"`` (a
    ``string="false"`` value that is not JSON, kept as a string in a call that is read) or ``"end"``
    (the end token).
    Raises ``ValueError`` for an unknown ``thinking_mode``.
    """
    check_thinking_mode(thinking_mode)
    if not isinstance(text, str):
        raise ParseError(0, "the completion as a str", f"<{type(text).__name__}>")
    parser = _Parser(text, strict)
    reasoning = parser.reasoning() if thinking_mode == "thinking" else ""
    content, has_calls = parser.content()
    calls = parser.tool_calls() if has_calls else []
    parser.end()
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "reasoning_content": reasoning,
        "tool_calls": calls,
    }
    if not strict:
        message["problems"] = [p.as_dict() for p in parser.problems]
    return message
