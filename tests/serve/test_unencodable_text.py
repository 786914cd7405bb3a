"""A string UTF-8 cannot encode (a lone surrogate, which ``json.dumps`` writes as ``"\\ud800"``)
anywhere in a request is a 400 in OpenAI's error JSON naming where it is, on every endpoint that
tokenizes; the server keeps serving."""

from __future__ import annotations

import json

import httpx2 as httpx
import pytest
from helpers import v32_model as V
from helpers.serve import client_for

MODEL = "tiny-v32"
BAD = "ok \ud800 here"
USER = [{"role": "user", "content": "hi"}]
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "x"}'}}
ROUND = [*USER, {"role": "assistant", "content": None, "tool_calls": [CALL]}]


def _chat(messages, **extra):
    return "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 2, **extra}


CASES = {
    "user content": (_chat([{"role": "user", "content": BAD}]), "messages[0].content", "messages"),
    "system message": (_chat([{"role": "system", "content": BAD}, *USER]), "messages[0].content", "messages"),
    "text part": (
        _chat([{"role": "user", "content": [{"type": "text", "text": BAD}]}]),
        "messages[0].content[0].text",
        "messages",
    ),
    "tool result": (
        _chat([*ROUND, {"role": "tool", "tool_call_id": "c1", "content": BAD}], tools=V.TOOLS),
        "messages[2].content",
        "messages",
    ),
    "name": (_chat([{"role": "user", "content": "hi", "name": BAD}]), "messages[0].name", "messages"),
    "tool call arguments": (
        _chat([*USER, {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": BAD}}]}]),
        "messages[1].tool_calls[0].function.arguments",
        "messages",
    ),
    "tool description": (
        _chat(USER, tools=[{"type": "function", "function": {"name": "f", "description": BAD}}]),
        "tools[0].function.description",
        "tools",
    ),
    "stop string": (_chat(USER, stop=[BAD]), "stop[0]", "stop"),
    "completion prompt": (("/v1/completions", {"model": MODEL, "prompt": BAD}), "prompt", "prompt"),
    "completion prompt list": (("/v1/completions", {"model": MODEL, "prompt": [BAD]}), "prompt", "prompt"),
    "tokenize prompt": (("/tokenize", {"model": MODEL, "prompt": BAD}), "prompt", "prompt"),
    "tokenize messages": (
        ("/tokenize", {"model": MODEL, "messages": [{"role": "user", "content": BAD}]}),
        "messages[0].content",
        "messages",
    ),
}  # fmt: skip


@pytest.mark.parametrize(("request_", "where", "param"), CASES.values(), ids=CASES.keys())
def test_a_lone_surrogate_is_a_400_naming_where_it_is(v32_server, request_, where, param):
    path, body = request_
    raw = json.dumps(body)  # Python's own JSON writes the lone surrogate as the escape \ud800
    assert "\\ud800" in raw
    root = v32_server.base_url.removesuffix("/v1")
    reply = httpx.post(root + path, content=raw, headers={"content-type": "application/json"})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert error["message"] == (
        f"{where} holds the lone surrogate '\\ud800' (at character 3), which UTF-8 cannot encode: "
        "send the character itself or a complete surrogate pair"
    )


def test_a_streamed_request_is_refused_before_its_stream_and_the_server_keeps_serving(v32_server):
    root = v32_server.base_url.removesuffix("/v1")
    for path, body in [_chat([{"role": "user", "content": BAD}], stream=True),
                       ("/v1/completions", {"model": MODEL, "prompt": BAD, "stream": True})]:  # fmt: skip
        reply = httpx.post(
            root + path, content=json.dumps(body), headers={"content-type": "application/json"}
        )
        assert reply.status_code == 400 and "lone surrogate" in reply.json()["error"]["message"]
    # (the openai client cannot send such a string at all: it encodes its body as UTF-8 first)
    client = client_for(v32_server)
    r = client.chat.completions.create(model=MODEL, messages=V.QUESTION, temperature=0)
    assert r.choices[0].message.content == V.CHAT_ANSWER
    # a complete surrogate pair is a character like any other
    ok = httpx.post(root + "/tokenize", content=json.dumps({"model": MODEL, "prompt": "pair \ud83d\ude00"}),
                    headers={"content-type": "application/json"})  # fmt: skip
    assert ok.status_code == 200 and ok.json()["prompt"] == "pair \U0001f600"
