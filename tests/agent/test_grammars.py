"""The grammars of forced tool calls and JSON replies, without a model: random walks through each
grammar's allowed tokens always end in text that the format's own parser reads as calls of offered
tools with schema-valid arguments (DSML on the V3.2 format; hermes, llama3_json and mistral)."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from helpers import v32_model

pytest.importorskip("llguidance")

from dsv32.agent.backends import grammars
from dsv32.agent.backends.toolparsers import tool_parser
from dsv32.chat import EOS, parse_completion
from dsv32.engine.constraint import Grammar, vocabulary

TOOLS = [
    {"type": "function", "function": {"name": "set", "parameters": {"type": "object", "properties": {
        "hour": {"type": "integer", "minimum": 0, "maximum": 23},
        "mode": {"enum": ["on", "off"]},
        "code": {"type": "string", "pattern": "^[a-c]{1,3}$"},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}},
        "required": ["hour", "code"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "opt", "parameters": {"type": "object", "properties": {
        "a": {"type": "boolean"}, "b": {"type": "null"}}, "additionalProperties": False}}},
    {"type": "function", "function": {"name": "none"}},
]  # fmt: skip
SCHEMAS = {t["function"]["name"]: t["function"].get("parameters", {"maxProperties": 0}) for t in TOOLS}


@pytest.fixture(scope="module")
def tokenizer():
    return v32_model.byte_tokenizer()


def _walk(grammar: Grammar, tokenizer, eos: int, seed: int, steps: int = 400) -> str:
    """A random text of the grammar: each step a uniformly random allowed token, until the end token."""
    generator = torch.Generator().manual_seed(seed)
    constraint, ids = grammar.constraint(), []
    for _ in range(steps):
        allowed = constraint.allowed().nonzero().flatten()
        token = int(allowed[torch.randint(len(allowed), (1,), generator=generator)])
        if token == eos:
            return tokenizer.decode(ids, skip_special_tokens=False)
        constraint.advance(token)
        ids.append(token)
    raise AssertionError(f"no end after {steps} tokens: {tokenizer.decode(ids, skip_special_tokens=False)!r}")


def _check_calls(calls: list[dict], names: set[str]) -> None:
    assert calls
    for call in calls:
        name = call["function"]["name"]
        assert name in names
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])


@pytest.mark.parametrize("many", [False, True])
def test_dsml_walks_parse_into_valid_calls(tokenizer, many):
    eos = tokenizer.convert_tokens_to_ids(EOS)
    voc = vocabulary(tokenizer, len(tokenizer), [eos], grammars.V32_MARKUP)
    grammar = Grammar(grammars.reply(lambda r: grammars.dsml_calls(r, TOOLS, many)), voc)
    counts = set()
    for seed in range(25):
        text = _walk(grammar, tokenizer, eos, seed)
        parsed = parse_completion(text + EOS, "chat")  # strict: any deviation raises
        _check_calls(parsed["tool_calls"], set(SCHEMAS))
        assert not parsed["content"]
        counts.add(len(parsed["tool_calls"]))
    assert counts == {1} if not many else max(counts) > 1


@pytest.mark.parametrize("parser_name", ["hermes", "llama3_json", "mistral"])
def test_template_walks_parse_into_valid_calls(tokenizer, parser_name):
    eos = tokenizer.convert_tokens_to_ids(EOS)
    parser = tool_parser(parser_name)
    voc = vocabulary(tokenizer, len(tokenizer), [eos], grammars.TEMPLATE_MARKUP)
    named = Grammar(grammars.reply(lambda r: grammars.template_calls(r, parser, TOOLS[:1], False)), voc)
    several = Grammar(grammars.reply(lambda r: grammars.template_calls(r, parser, TOOLS, True)), voc)
    for seed in range(20):
        content, calls, problems = parser.parse(_walk(named, tokenizer, eos, seed))
        assert not problems and not content.strip() and len(calls) == 1
        _check_calls(calls, {"set"})
        content, calls, problems = parser.parse(_walk(several, tokenizer, eos, seed))
        assert not problems and not content.strip()
        _check_calls(calls, set(SCHEMAS))


def test_reasoning_stays_free_until_the_first_think_end(tokenizer):
    eos = tokenizer.convert_tokens_to_ids(EOS)
    voc = vocabulary(tokenizer, len(tokenizer), [eos], grammars.V32_MARKUP)
    schema = {"type": "object", "properties": {"x": {"enum": [1, 2]}}, "required": ["x"]}
    grammar = Grammar(grammars.reply(lambda r: grammars.json_reply(r, schema), reasoning=True), voc)
    constraint = grammar.constraint()
    for token in tokenizer.encode("any <b>text</b>, even {json}</think>", add_special_tokens=False):
        assert constraint.allowed()[token]
        constraint.advance(token)
    allowed = constraint.allowed().nonzero().flatten().tolist()
    assert tokenizer.decode(allowed) == "{"
