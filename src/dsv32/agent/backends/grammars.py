"""Grammars of what a reply must be, in the served model's own format: tool calls (``tool_choice``
``"required"`` or a named function) and JSON (``response_format``), as Lark text for
:class:`dsv32.engine.constraint.Grammar`.

A grammar describes the text the format's parser reads back, so a reply that follows it parses into
calls of the offered tools whose arguments are valid under their ``parameters`` schemas:

- the V3.2 format (:func:`dsml_calls`): one DSML ``function_calls`` block as
  :func:`dsv32.chat.encode_messages` writes it — one ``invoke`` per call, its parameters in the
  schema's order (the required ones always, the others optional, no others), a plain string
  parameter written raw (``string="true"``, anything up to the closing tag), any other value as JSON
  under its own schema (``string="false"``);
- chat-template models (:func:`template_calls`): the calls as the model family's tool-call parser
  reads them — ``hermes`` ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` blocks
  joined by newlines, ``llama3_json`` objects joined by ``"; "``, ``mistral``
  ``[TOOL_CALLS][{...}, ...]`` — with the arguments JSON under the tool's schema;
- :func:`json_reply`: a JSON value under a schema.

With V3.2's thinking mode the reasoning before ``</think>`` stays free (:func:`reply`); nothing else is.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from dsv32.agent.backends.formats import THINK_CLOSE, THINK_OPEN
from dsv32.agent.backends.toolparsers import Llama3JsonParser, MistralParser, ToolParser
from dsv32.chat import protocol as P
from dsv32.engine.constraint import GrammarError, json_rule, lark_string

#: Strings of each format's markup that its grammars write as text (special tokens holding them are
#: text to the grammar, see :class:`dsv32.engine.constraint.Vocabulary`).
V32_MARKUP = (
    P.CALLS_START + "\n",
    P.CALLS_CLOSE,
    P.INVOKE_OPEN,
    '">\n',
    P.INVOKE_CLOSE,
    P.PARAM_OPEN,
    '" string="true">',
    '" string="false">',
    P.PARAM_CLOSE,
    P.THINK_START,
    P.THINK_END,
)
TEMPLATE_MARKUP = (
    "<tool_call>",
    "</tool_call>",
    Llama3JsonParser.PYTHON_TAG,
    MistralParser.start,
    MistralParser.ARGS,
    THINK_OPEN,
    THINK_CLOSE,
)

#: A string parameter whose schema says no more than this is written raw in DSML.
_PLAIN_STRING_KEYS = {"type", "description", "title", "examples", "default"}


class _Rules:
    """Lark rules under generated names."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, body: str, attributes: str = "") -> str:
        name = f"r{len(self.lines)}"
        self.lines.append(f"{name}{attributes}: {body}")
        return name

    def grammar(self, start: str) -> str:
        return "\n".join([f"start: {start}", *self.lines]) + "\n"


def _lazy_until(text: str) -> str:
    """A Lark regex of any text up to and including the first ``text``."""
    escaped = "".join("\\" + c if c in "\\.+*?()|[]{}^$#&-~/" else c for c in text)
    return f"/(?s:.*){escaped}/".replace("\n", "\\n")


def _schema(tool: dict) -> dict[str, Any]:
    """The tool's ``parameters``; a function without them takes none (OpenAI's reading)."""
    parameters = tool.get("function", tool).get("parameters")
    return (
        {"type": "object", "properties": {}, "additionalProperties": False}
        if parameters is None
        else parameters
    )


def _name(tool: dict) -> str:
    return tool.get("function", tool)["name"]


def _checked(tools: Sequence[dict]) -> list[dict]:
    if not tools:
        raise GrammarError("a tool-call grammar needs at least one tool")
    return list(tools)


# ------------------------------------------------------------------------------------------ DSML
# Each piece of markup carries the newline before it: llguidance's lexer is greedy, so a newline of its
# own could not be followed by a piece that another literal starting with a newline also allows.
def _dsml_param(rules: _Rules, key: str, schema: Any) -> str:
    """One parameter, the newline before it included."""
    if isinstance(schema, dict) and schema.get("type") == "string" and set(schema) <= _PLAIN_STRING_KEYS:
        opening = lark_string(f'\n{P.PARAM_OPEN}{key}" string="true">')
        return rules.add(f"{opening} {rules.add(_lazy_until(P.PARAM_CLOSE), '[lazy]')}")
    opening = lark_string(f'\n{P.PARAM_OPEN}{key}" string="false">')
    value = rules.add(json_rule(schema if isinstance(schema, dict) else {}))
    return rules.add(f"{opening} {value} {lark_string(P.PARAM_CLOSE)}")


def _some_in_order(rules: _Rules, params: list[str]) -> str:
    """At least one of ``params`` (all optional), in order."""
    tail = head = ""
    for param in reversed(params):
        head = rules.add(f"{param} {tail} | {head}" if head else f"{param} {tail}")
        tail = rules.add(f"({param})? {tail}")
    return head


def _dsml_invoke(rules: _Rules, tool: dict) -> str:
    """One ``invoke``, the newline before it included: the parameters in the schema's order, each
    required one present, none other; no parameters at all is written with an empty line."""
    schema = _schema(tool)
    properties = dict(schema.get("properties") or {})
    required = set(schema.get("required") or [])
    for key in sorted(required - set(properties)):
        properties[key] = {}
    params = [(_dsml_param(rules, key, sub), key in required) for key, sub in properties.items()]
    opening = lark_string(f'\n{P.INVOKE_OPEN}{_name(tool)}">')
    closing = lark_string("\n" + P.INVOKE_CLOSE)
    empty = lark_string("\n\n" + P.INVOKE_CLOSE)
    if any(needed for _, needed in params):
        body = " ".join(param if needed else f"({param})?" for param, needed in params)
        return rules.add(f"{opening} {body} {closing}")
    if params:
        return rules.add(f"{opening} ({_some_in_order(rules, [p for p, _ in params])} {closing} | {empty})")
    return rules.add(f"{opening} {empty}")


def dsml_calls(rules: _Rules, tools: Sequence[dict], many: bool) -> str:
    """The V3.2 DSML block of one call (``many``: one or more) of ``tools``."""
    invoke = rules.add(" | ".join(_dsml_invoke(rules, tool) for tool in _checked(tools)))
    calls = f"{invoke}+" if many else invoke
    opening, closing = lark_string(P.CALLS_START), lark_string("\n" + P.CALLS_CLOSE)
    return rules.add(f"{opening} {calls} {closing}")


# ------------------------------------------------------------------------------------------ templates
#: per parser: (before the calls, a call's opening with {name}, its arguments' key, between calls, after)
_TEMPLATE_CALLS = {
    "hermes": ("", '<tool_call>\n{{"name": {name}, "arguments": ', "}\n</tool_call>", "\n", ""),
    "llama3_json": ("", '{{"name": {name}, "parameters": ', "}", "; ", ""),
    "mistral": ("[TOOL_CALLS][", '{{"name": {name}, "arguments": ', "}", ", ", "]"),
}


def template_calls(rules: _Rules, parser: ToolParser, tools: Sequence[dict], many: bool) -> str:
    """The calls of one tool (``many``: one or more) of ``tools`` as ``parser`` reads them."""
    if parser.name not in _TEMPLATE_CALLS:
        raise GrammarError(f"no tool-call grammar for the {parser.name!r} parser")
    before, opening, closing, between, after = _TEMPLATE_CALLS[parser.name]
    calls = []
    for tool in _checked(tools):
        name = json.dumps(_name(tool), ensure_ascii=False)
        arguments = rules.add(json_rule(_schema(tool)))
        calls.append(
            rules.add(f"{lark_string(opening.format(name=name))} {arguments} {lark_string(closing)}")
        )
    call = rules.add(" | ".join(calls))
    body = f"{call} ({lark_string(between)} {call})*" if many else call
    parts = [lark_string(before)] if before else []
    parts.append(body)
    if after:
        parts.append(lark_string(after))
    return rules.add(" ".join(parts))


def json_reply(rules: _Rules, schema: dict[str, Any]) -> str:
    return rules.add(json_rule(schema))


def reply(body, *, reasoning: bool = False) -> str:
    """The Lark grammar of a whole reply: ``body(rules)`` (one of the builders above with its rules),
    after free reasoning up to the first ``</think>`` when ``reasoning`` (V3.2's thinking mode)."""
    rules = _Rules()
    start = body(rules)
    if reasoning:
        start = f"{rules.add(_lazy_until(P.THINK_END), '[lazy]')} {start}"
    return rules.grammar(start)
