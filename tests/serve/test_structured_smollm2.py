"""Structured outputs on SmolLM2 (its chat template, hermes tool calls) through the official client: a
forced or required call always parses into a call of an offered tool with schema-valid arguments,
and a ``response_format`` reply always validates. One batch of 4 prompts in the default run (a required
call with parallel calls allowed, a named call, a required single call, a JSON reply); the sweep over
160 prompts is slow."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest
from helpers.serve import client_for

pytest.importorskip("llguidance")

MODEL = "smollm2"
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Local time in a city, shifted by some hours",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 40}, "hours": {"type": "integer", "minimum": -12, "maximum": 12}},
            "required": ["city", "hours"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two numbers",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                       "required": ["a", "b"], "additionalProperties": False}}},
]  # fmt: skip
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
QUESTIONS = [
    "What's the weather in Tokyo?", "Is it raining in London right now?", "What time is it in Sydney?",
    "Add 2 and 40.", "How warm is Paris in fahrenheit?", "Time in New York plus 3 hours?",
    "What is 1.5 plus 2.25?", "Weather for Berlin, please.", "Tell me a joke.", "Hello!",
    "Will it snow in Oslo?", "What's 7 + 8?", "Current time in Lagos?", "Is Rome sunny?",
    "Sum 100 and -3.", "Cairo weather in celsius.", "When is it noon in Lima?", "Hi, who are you?",
    "How hot is Dubai?", "Add ten and twenty.",
]  # fmt: skip
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 30}, "age": {"type": "integer", "minimum": 0,
                   "maximum": 130}, "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 3}},
    "required": ["name", "age"],
    "additionalProperties": False,
}  # fmt: skip


def _request(client, i: int, question: str) -> dict:
    names = list(SCHEMAS)
    kind = i % 4
    body = {"model": MODEL, "messages": [{"role": "user", "content": question}], "max_tokens": 96,
            "temperature": 0.0 if i % 2 == 0 else 0.8, "seed": i}  # fmt: skip
    if kind == 3:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
        body["messages"][0]["content"] = f"Describe someone as JSON. {question}"
    else:
        named = {"type": "function", "function": {"name": names[i % 3]}}
        body |= {"tools": TOOLS, "tool_choice": named if kind == 1 else "required"}
        body["parallel_tool_calls"] = kind != 2
    reply = client.chat.completions.create(**body).choices[0]
    return {"body": body, "reply": reply}


def _check(result: dict) -> None:
    """Every call parses and validates. With parallel calls allowed a small model may go on calling
    until ``max_tokens`` (greedy SmolLM2 repeats its call): the complete calls still count."""
    body, reply = result["body"], result["reply"]
    if "response_format" in body:
        assert reply.finish_reason == "stop", (body, reply)
        jsonschema.validate(json.loads(reply.message.content), PERSON)
        return
    calls = reply.message.tool_calls or []
    several = body["tool_choice"] == "required" and body["parallel_tool_calls"]
    assert calls and reply.finish_reason in (("tool_calls", "length") if several else ("tool_calls",))
    for call in calls:
        assert call.function.name in SCHEMAS
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    choice = body["tool_choice"]
    if isinstance(choice, dict):
        assert [c.function.name for c in calls] == [choice["function"]["name"]]
    if body.get("parallel_tool_calls") is False:
        assert len(calls) == 1


def _sweep(smol_server, questions: list[str]) -> None:
    client = client_for(smol_server, timeout=600)
    with ThreadPoolExecutor(4) as pool:  # the server's batch is 4 rows
        for result in pool.map(lambda args: _request(client, *args), enumerate(questions)):
            _check(result)


def test_forced_calls_and_json_replies_always_parse_and_validate(smol_server):
    _sweep(smol_server, QUESTIONS[:4])


@pytest.mark.slow
def test_forced_calls_and_json_replies_always_parse_and_validate_sweep(smol_server):
    openers = ["", "Please answer: ", "Quick question. ", "I need help. "]
    _sweep(smol_server, [o + q for o in openers for q in QUESTIONS] * 2)
