"""Tool-call formats of chat models that do not speak the V3.2 format, one per model family (as
vLLM's ``--tool-call-parser`` names them):

- ``hermes`` — ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, one block per call,
  anywhere in the reply (Hermes, Qwen 2.5/3, SmolLM3; what SmolLM2 is instructed to write);
- ``llama3_json`` — the whole reply is the call, ``{"name": ..., "parameters": {...}}`` (several
  separated by ``;``), optionally after ``<|python_tag|>`` (Llama 3.1-3.3);
- ``mistral`` — ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` after the content, or the
  newer ``[TOOL_CALLS]name[ARGS]{...}`` per call (Mistral, Mixtral).

A :class:`ToolParser` knows how calls are written (:meth:`~ToolParser.render`, for the assistant turns
of a template that does not render ``tool_calls`` itself), how the tools are announced to a template
that ignores ``tools`` (:meth:`~ToolParser.instructions`), how a reply's calls are read back
(:meth:`~ToolParser.parse`: ``(content, calls, problems)``, each problem in a tool-call block as the
V3.2 parser marks them), where calls begin (``start``; ``at_start_only``: only as the reply's first
text) and end (``end``, when each call closes on its own), and the text that opens a call
(:meth:`~ToolParser.opening`). The grammar a server constrains forced calls with
(:mod:`dsv32.agent.backends.grammars`) writes calls as :meth:`~ToolParser.parse` reads them.
:func:`detect_parser` picks one from a chat template; the rest default to ``hermes``.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Sequence
from typing import Any

from dsv32.agent.errors import AgentError


def _call(name: Any, arguments: Any) -> dict:
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def _problem(position: int, expected: str, message: str = "") -> dict:
    return {"part": "tool_calls", "position": position, "expected": expected, "message": message}


def _call_arguments(call: dict) -> tuple[Any, Any]:
    """A call's name and its arguments as a JSON value (arguments that are not JSON stay a string:
    the tool answered them with an error, and the model sees what it sent)."""
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):
            arguments = json.loads(arguments)
    return function.get("name"), arguments


def _schemas(tools: Sequence[dict]) -> str:
    return "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)


class ToolParser:
    name = ""
    start = ""
    end: str | None = None
    at_start_only = False

    def render(self, call: dict) -> str:
        raise NotImplementedError

    def instructions(self, tools: Sequence[dict]) -> str:
        raise NotImplementedError

    def parse(self, text: str) -> tuple[str, list[dict], list[dict]]:
        raise NotImplementedError

    def opening(self, name: str | None) -> str:
        """The text that opens a call of ``name`` (None: of a function the model names)."""
        raise NotImplementedError

    def calls_begin(self, text: str) -> int:
        """Where the calls begin in a reply's content ``text``, or -1."""
        if self.at_start_only:
            head = len(text) - len(text.lstrip())
            return head if text.startswith(self.start, head) else -1
        return text.find(self.start)


class HermesParser(ToolParser):
    name = "hermes"
    start, end = "<tool_call>", "</tool_call>"
    _BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)

    def render(self, call: dict) -> str:
        name, arguments = _call_arguments(call)
        body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        return f"{self.start}\n{body}\n{self.end}"

    def instructions(self, tools: Sequence[dict]) -> str:
        return (
            "# Tools\n\nYou can call the functions described by these JSON schemas:\n<tools>\n"
            f"{_schemas(tools)}\n</tools>\n\n"
            "To call a function, write a JSON object with its name and arguments between <tool_call> and "
            "</tool_call>, one block per call, for example:\n"
            '<tool_call>\n{"name": "function_name", "arguments": {"argument": "value"}}\n</tool_call>\n'
            "The results come back in the next message. When you have the answer, reply without a tool call."
        )

    def parse(self, text: str) -> tuple[str, list[dict], list[dict]]:
        calls, problems = [], []
        for match in self._BLOCK.finditer(text):
            try:
                body = json.loads(match.group(1))
            except ValueError as err:
                problems.append(_problem(match.start(), "a JSON object in <tool_call>", str(err)))
                continue
            if not isinstance(body, dict) or not isinstance(body.get("name"), str):
                problems.append(_problem(match.start(), '{"name": ..., "arguments": ...}'))
                continue
            calls.append(_call(body["name"], body.get("arguments", body.get("parameters", {}))))
        return self._BLOCK.sub("", text), calls, problems

    def opening(self, name: str | None) -> str:
        head = f'{self.start}\n{{"name": "'
        return head if name is None else f'{head}{name}", "arguments": '


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    start = "{"
    at_start_only = True
    PYTHON_TAG = "<|python_tag|>"

    def render(self, call: dict) -> str:
        name, arguments = _call_arguments(call)
        return json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False)

    def instructions(self, tools: Sequence[dict]) -> str:
        return (
            "You can call these functions, described by JSON schemas:\n"
            f"{_schemas(tools)}\n\n"
            'To call one, reply with only a JSON object {"name": "function_name", "parameters": '
            '{"argument": "value"}} (several calls: the objects separated by "; "). The results come '
            "back in the next message. When you have the answer, reply in words without JSON."
        )

    def calls_begin(self, text: str) -> int:
        head = len(text) - len(text.lstrip())
        if text.startswith(self.PYTHON_TAG, head):
            return head
        return super().calls_begin(text)

    def parse(self, text: str) -> tuple[str, list[dict], list[dict]]:
        begin = self.calls_begin(text)
        if begin < 0:
            return text, [], []
        body = text[begin:].removeprefix(self.PYTHON_TAG).strip()
        decoder, position, calls = json.JSONDecoder(), 0, []
        while position < len(body):
            try:
                value, position = decoder.raw_decode(body, position)
            except ValueError as err:
                return text, [], [_problem(begin, '{"name": ..., "parameters": ...}', str(err))]
            if not isinstance(value, dict) or not isinstance(value.get("name"), str):
                return text, [], [_problem(begin, '{"name": ..., "parameters": ...}')]
            calls.append(_call(value["name"], value.get("parameters", value.get("arguments", {}))))
            rest = body[position:].lstrip()
            position = len(body) - len(rest.removeprefix(";").lstrip())
        return text[:begin], calls, []

    def opening(self, name: str | None) -> str:
        return '{"name": "' if name is None else f'{{"name": "{name}", "parameters": '


class MistralParser(ToolParser):
    name = "mistral"
    start = "[TOOL_CALLS]"
    ARGS = "[ARGS]"

    def render(self, call: dict) -> str:
        name, arguments = _call_arguments(call)
        return self.start + json.dumps([{"name": name, "arguments": arguments}], ensure_ascii=False)

    def instructions(self, tools: Sequence[dict]) -> str:
        return (
            "You can call these functions, described by JSON schemas:\n"
            f"{_schemas(tools)}\n\n"
            'To call functions, write [TOOL_CALLS] and then a JSON list of calls, [{"name": "function_name", '
            '"arguments": {"argument": "value"}}]. The results come back in the next message. When you '
            "have the answer, reply without a tool call."
        )

    def parse(self, text: str) -> tuple[str, list[dict], list[dict]]:
        begin = text.find(self.start)
        if begin < 0:
            return text, [], []
        calls: list[dict] = []
        for part in text[begin:].split(self.start)[1:]:
            part = part.strip()
            try:
                if part.startswith("["):
                    value, _ = json.JSONDecoder().raw_decode(part)
                    items = value if isinstance(value, list) else [value]
                    if not all(isinstance(v, dict) and isinstance(v.get("name"), str) for v in items):
                        raise ValueError("each call needs a string name")
                    calls += [_call(v["name"], v.get("arguments", {})) for v in items]
                else:
                    name, args, arguments = part.partition(self.ARGS)
                    if not args:
                        raise ValueError("no [ARGS] after the function name")
                    value, _ = json.JSONDecoder().raw_decode(arguments.strip())
                    calls.append(_call(name.strip(), value))
            except ValueError as err:
                expected = '[{"name": ..., "arguments": ...}] or name[ARGS]{...}'
                return text[:begin], [], [_problem(begin, expected, str(err))]
        return text[:begin], calls, []

    def opening(self, name: str | None) -> str:
        head = f'{self.start}[{{"name": "'
        return head if name is None else f'{head}{name}", "arguments": '


PARSERS: dict[str, type[ToolParser]] = {p.name: p for p in (HermesParser, Llama3JsonParser, MistralParser)}


def detect_parser(chat_template: str | None) -> str:
    """The tool-call format a chat template's family writes: ``mistral`` for one that knows
    ``[TOOL_CALLS]``, ``llama3_json`` for Llama 3's (``<|python_tag|>``, the ``ipython`` role), else
    ``hermes`` (also for templates that know no tools at all, such as SmolLM2's)."""
    template = chat_template or ""
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|python_tag|>" in template or "ipython" in template:
        return "llama3_json"
    return "hermes"


def tool_parser(name: str | None, chat_template: str | None = None) -> ToolParser:
    """The parser ``name`` (None or ``"auto"``: :func:`detect_parser` of ``chat_template``)."""
    name = detect_parser(chat_template) if name in (None, "auto") else name
    if name not in PARSERS:
        raise AgentError(f"unknown tool-call parser {name!r}: use one of {['auto', *PARSERS]}")
    return PARSERS[name]()
