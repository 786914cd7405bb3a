"""Structured outputs on the tiny V3.2 model (random weights: only the grammar makes its replies calls or
JSON): ``tool_choice`` ``required`` / named always parse into calls of offered tools with
schema-valid arguments, ``response_format`` replies validate, thinking stays free before ``</think>``,
streaming under a constraint equals the non-streamed reply, and schemas the library cannot compile
are 400s."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from helpers import v32_model as V
from helpers.serve import client_for

pytest.importorskip("llguidance")

MODEL = "tiny-v32"
#: tools whose arguments a random model finishes: every value bounded by its schema
BOUNDED = [
    {"type": "function", "function": {"name": "set_alarm", "parameters": {
        "type": "object",
        "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23},
                       "days": {"type": "array", "items": {"enum": ["mon", "tue"]}, "maxItems": 2},
                       "loud": {"type": "boolean"}},
        "required": ["hour"]}}},
    {"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"color": {"enum": ["red", "green"]}}, "required": ["color"],
        "additionalProperties": False}}},
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}},
]  # fmt: skip
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in BOUNDED + V.TOOLS}
ANSWER = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "score": {"type": "integer", "minimum": -5, "maximum": 5}},
    "required": ["ok", "score"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Do it."}]


def _valid_calls(choice, offered) -> list[tuple[str, dict]]:
    calls = []
    for call in choice.message.tool_calls or []:
        assert call.function.name in offered
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, SCHEMAS[call.function.name])
        calls.append((call.function.name, arguments))
    return calls


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_required_and_named_calls_always_parse_to_offered_tools(v32_server, temperature):
    client = client_for(v32_server)
    names = [t["function"]["name"] for t in BOUNDED]
    for seed in range(6):
        r = client.chat.completions.create(
            model=MODEL, messages=ASK, tools=BOUNDED, tool_choice="required", parallel_tool_calls=False,
            temperature=temperature, seed=seed, max_tokens=300,
        )  # fmt: skip
        assert r.choices[0].finish_reason == "tool_calls"
        assert len(_valid_calls(r.choices[0], names)) == 1 and not r.choices[0].message.content
        named = {"type": "function", "function": {"name": names[seed % 3]}}
        r = client.chat.completions.create(
            model=MODEL, messages=ASK, tools=BOUNDED, tool_choice=named, temperature=temperature, seed=seed,
            max_tokens=300,
        )  # fmt: skip
        assert [n for n, _ in _valid_calls(r.choices[0], names)] == [names[seed % 3]]
        assert r.choices[0].finish_reason == "tool_calls"


def test_required_lets_the_model_make_several_calls_each_valid(v32_server):
    client = client_for(v32_server)
    counts = set()
    for seed in range(6):
        r = client.chat.completions.create(
            model=MODEL, messages=ASK, tools=BOUNDED, tool_choice="required", temperature=1.0, seed=seed,
            max_tokens=600,
        )  # fmt: skip
        if r.choices[0].finish_reason == "tool_calls":
            counts.add(len(_valid_calls(r.choices[0], SCHEMAS)))
    assert counts and min(counts) >= 1


def test_thinking_stays_free_before_the_forced_calls(v32_server):
    """The scripted thinking turn (reasoning, then two calls) is what the grammar allows."""
    client = client_for(v32_server)
    question = [{"role": "system", "content": V.QUESTION[0]["content"]}, V.QUESTION[1]]
    r = client.chat.completions.create(
        model=MODEL, messages=question, tools=V.TOOLS, tool_choice="required", temperature=0,
        extra_body={"chat_template_kwargs": {"thinking": True}},
    )  # fmt: skip
    assert r.choices[0].message.reasoning_content == V.REASONING
    assert _valid_calls(r.choices[0], SCHEMAS) == V.CALLS


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_replies_always_validate(v32_server, temperature):
    client = client_for(v32_server)
    response_format = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
    r = client.chat.completions.create(
        model=MODEL, messages=ASK, response_format=response_format, temperature=temperature, seed=0,
        max_tokens=200, n=3,
    )  # fmt: skip
    for choice in r.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), ANSWER)


def _reassemble(stream) -> tuple[str, list[tuple[str, str]], str]:
    content, calls, reason = "", {}, None
    for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for tc in choice.delta.tool_calls or []:
                name, arguments = calls.get(tc.index, ("", ""))
                calls[tc.index] = (name + (tc.function.name or ""), arguments + (tc.function.arguments or ""))
            reason = choice.finish_reason or reason
    return content, [calls[i] for i in sorted(calls)], reason


def test_streaming_under_a_constraint_equals_the_reply(v32_server):
    client = client_for(v32_server)
    requests = [
        {"tools": BOUNDED, "tool_choice": "required"},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}}},
    ]
    for extra in requests:
        body = {"model": MODEL, "messages": ASK, "temperature": 1.0, "seed": 5, "max_tokens": 400, **extra}
        whole = client.chat.completions.create(**body).choices[0]
        content, calls, reason = _reassemble(client.chat.completions.create(**body, stream=True))
        assert reason == whole.finish_reason
        assert content == (whole.message.content or "")
        assert calls == [(c.function.name, c.function.arguments) for c in whole.message.tool_calls or []]


@pytest.mark.parametrize(
    ("extra", "param", "message"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "strin"}}}},
         "response_format", "Invalid type: strin"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"not": {}}}}},
         "response_format", "Unimplemented keys"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}}], "tool_choice": "required"},
         "tools", "does not exist"),
    ],
)  # fmt: skip
def test_a_schema_the_library_cannot_compile_is_a_400(v32_server, extra, param, message):
    client = client_for(v32_server)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=5, **extra)
    body = info.value.body
    assert body["param"] == param and message in body["message"] and body["type"] == "invalid_request_error"


def test_tool_choice_auto_stays_free(v32_served):
    from dsv32.serve.protocol import ChatCompletionRequest

    body = {"model": MODEL, "messages": ASK, "tools": BOUNDED}
    assert v32_served.chat_prompt(ChatCompletionRequest.model_validate(body)).grammar is None
    auto = ChatCompletionRequest.model_validate(body | {"tool_choice": "auto"})
    assert v32_served.chat_prompt(auto).grammar is None
