"""Malformed replies of an OpenAI-compatible server (through the real openai client and the stub
server) or of a script. What the protocol fixes is refused with a typed error naming the field (in an
episode: "error", keeping what it did); what the model wrote inside a tool call is answered by the
toolbox and the episode goes on."""

from __future__ import annotations

import pytest
from helpers.agent import add, answer, calls, chunk

from dsv32.agent import Agent, AgentError, BackendError, OpenAIBackend, ScriptedBackend

GOOD_CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}


def body(message: dict | None = None, finish: str = "tool_calls", **fields) -> dict:
    """A chat completion whose first choice holds ``message`` (an assistant message's fields)."""
    return {
        "id": "cmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", **(message or {})}, "finish_reason": finish}
        ],
        "usage": {"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55},
        **fields,
    }


def with_choice(choice) -> dict:
    return {**body(), "choices": [choice]}


def message(**fields) -> dict:
    return body({"content": "", **fields})


REFUSED = {
    "function is a string": (
        message(tool_calls=[{"id": "c", "type": "function", "function": "add"}]),
        "choices[0].message.tool_calls[0].function is a string ('add'), not an object",
    ),
    "function missing": (
        message(tool_calls=[{"id": "c", "type": "function"}]),
        "tool_calls[0].function is missing or null",
    ),
    "tool call null": (message(tool_calls=[None]), "choices[0].message.tool_calls[0] is null"),
    "tool call a string": (message(tool_calls=["add"]), "tool_calls[0] is a string ('add')"),
    "tool_calls an object": (
        message(tool_calls={"id": "c", "function": {"name": "add"}}),
        "choices[0].message.tool_calls is an object, not a list",
    ),
    "name a number": (
        message(tool_calls=[{"id": "c", "function": {"name": 7, "arguments": "{}"}}]),
        "tool_calls[0].function.name is a number (7)",
    ),
    "id an object": (
        message(tool_calls=[{"id": {"x": 1}, "function": {"name": "add", "arguments": "{}"}}]),
        "tool_calls[0].id is an object",
    ),
    "content a number": (message(content=42), "choices[0].message.content is a number (42)"),
    "content parts not text": (
        message(content=[{"type": "image_url", "image_url": {"url": "x"}}]),
        "content[0] is an object, not a text part",
    ),
    "reasoning an object": (
        message(reasoning_content={"text": "x"}),
        "message.reasoning_content is an object",
    ),
    "message missing": (with_choice({"index": 0, "finish_reason": "stop"}), "choices[0].message is missing"),
    "message a string": (with_choice({"index": 0, "message": "5"}), "choices[0].message is a string ('5')"),
    "choice a string": (with_choice("5"), "choices[0] is a string ('5')"),
    "choices empty": ({**body(), "choices": []}, "returned no choices"),
    "choices missing": ({k: v for k, v in body().items() if k != "choices"}, "choices is missing or null"),
    "choices an object": ({**body(), "choices": {"0": {}}}, "choices is an object, not a list"),
    "finish_reason a number": (
        with_choice({"index": 0, "message": {"content": "x"}, "finish_reason": 1}),
        "choices[0].finish_reason is a number (1)",
    ),
    "usage a string": (body({"content": "x"}, usage="lots"), "usage is a string ('lots')"),
    "usage count a string": (
        body({"content": "x"}, usage={"prompt_tokens": "50", "completion_tokens": 5}),
        "usage.prompt_tokens is a string ('50'), not a non-negative integer",
    ),
    "body a JSON string": ("not json at all", "the response body is a string ('not json at all')"),
    "body a JSON list": (b"[1, 2]", "the response body is a list of 2, not a chat completion object"),
    "body not JSON": (b"{not json", "the response body is not readable JSON (JSONDecodeError"),
    "body not UTF-8": (b'{"choices": "\xff"}', "the response body is not readable JSON (UnicodeDecodeError"),
    "body HTML": ((b"<html>busy</html>", "text/html"), "the response body is a string ('<html>busy</html>')"),
    "error object in a 200": (
        {"error": {"message": "model overloaded"}},
        "answered with an error: model overloaded",
    ),
}


def queue(stub, payload) -> None:
    if isinstance(payload, tuple):
        stub.reply(payload[0], **{"Content-Type": payload[1]})
    else:
        stub.reply(payload)


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_malformed_reply_stops_the_episode_with_a_named_error_and_keeps_what_was_done(stub, case):
    payload, expected = REFUSED[case]
    stub.reply(body({"content": "", "tool_calls": [GOOD_CALL]}))
    queue(stub, payload)
    traj = Agent(OpenAIBackend(stub.url, "m", max_retries=0), [add]).run("2+3?")
    assert traj.stop_reason == "error" and expected in traj.error, traj.error
    assert traj.error.startswith(stub.url)
    # the round before the bad reply is kept: the call, its result and its step
    assert [m["role"] for m in traj.messages] == ["user", "assistant", "tool"]
    assert traj.messages[2]["content"] == "5" and traj.num_steps == 1 and traj.total_steps == 1
    assert len(stub.requests) == 2  # a malformed 200 is not retried


def test_the_backend_raises_backend_error_itself(stub):
    stub.reply(message(tool_calls=[None]))
    with pytest.raises(BackendError, match=r"tool_calls\[0\] is null"):
        OpenAIBackend(stub.url, "m", max_retries=0).complete([{"role": "user", "content": "q"}], [])


def run_with(stub, bad_reply: dict, tools=(add,)):
    stub.reply(bad_reply)
    stub.reply(body({"content": "done"}, "stop"))
    return Agent(OpenAIBackend(stub.url, "m", max_retries=0), list(tools)).run("2+3?")


def test_arguments_sent_as_an_object_are_read_as_json(stub):
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
    traj = run_with(stub, message(tool_calls=[call]))
    assert traj.stop_reason == "answer" and traj.messages[2]["content"] == "5"
    assert traj.messages[1]["tool_calls"][0]["function"]["arguments"] == '{"a": 2, "b": 3}'
    # what goes back to the server is the protocol's form: arguments as a string
    assert stub.requests[1]["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"a": 2, "b": 3}'


def test_the_model_s_broken_calls_are_answered_and_the_episode_goes_on(stub):
    broken = [
        {"id": "c1", "function": {"name": "add", "arguments": [2, 3]}},  # arguments a JSON list
        {"id": "c2", "function": {"name": "add", "arguments": None}},  # null arguments: {}
        {"function": {"name": None, "arguments": '{"a": 1}'}},  # no name, no id
        {"id": "c4", "function": {"arguments": "{"}},  # name missing, arguments not JSON
    ]
    traj = run_with(stub, message(tool_calls=broken))
    assert traj.stop_reason == "answer" and traj.final == "done"
    assert [t.error for t in traj.steps[0].tool_calls] == [
        "bad_json",
        "invalid_arguments",
        "unknown_tool",
        "unknown_tool",
    ]
    results = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert "must be a JSON object, got a JSON list" in results[0]
    assert results[2].startswith("Error: unknown tool ''")
    sent = stub.requests[1]["messages"][1]["tool_calls"]
    assert [c["function"] for c in sent] == [
        {"name": "add", "arguments": "[2, 3]"},
        {"name": "add", "arguments": "{}"},
        {"name": "", "arguments": '{"a": 1}'},
        {"name": "", "arguments": "{"},
    ]
    assert all(isinstance(c["id"], str) and c["id"] for c in sent)  # ids assigned where missing


def test_content_as_text_parts_is_joined(stub):
    stub.reply(message(content=[{"type": "text", "text": "2+3 "}, {"type": "text", "text": "is 5"}]))
    traj = Agent(OpenAIBackend(stub.url, "m", max_retries=0), [add]).run("2+3?")
    assert traj.stop_reason == "answer" and traj.final == "2+3 is 5"


# ------------------------------------------------------------------------------------------ streamed
def part(index=0, id=None, name=None, arguments=None) -> dict:
    out = {"index": index, "function": {}}
    if id is not None:
        out["id"] = id
    if name is not None:
        out["function"]["name"] = name
    if arguments is not None:
        out["function"]["arguments"] = arguments
    return out


USAGE = chunk(None, usage={"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52})

STREAM_REFUSED = {
    "tool_calls an object": (
        [chunk({"tool_calls": {"index": 0, "function": {"name": "add"}}})],
        "stream event 0: choices[0].delta.tool_calls is an object, not a list",
    ),
    "tool call part null": ([chunk({"tool_calls": [None]})], "choices[0].delta.tool_calls[0] is null"),
    "function a string": (
        [chunk({"tool_calls": [{"index": 0, "id": "c", "function": "add"}]})],
        "delta.tool_calls[0].function is a string ('add')",
    ),
    "index a string": (
        [chunk({"tool_calls": [{"index": "first", "function": {"name": "add"}}]})],
        "delta.tool_calls[0].index is a string ('first')",
    ),
    "arguments fragment a number": (
        [
            chunk({"tool_calls": [part(0, "c", "add", "{")]}),
            chunk({"tool_calls": [part(0, arguments=7)]}, "tool_calls"),
        ],
        None,  # a number fragment is written as JSON: the call's arguments are '{7', answered as bad_json
    ),
    "delta a string": (
        [{**chunk({}), "choices": [{"index": 0, "delta": "hi"}]}],
        "choices[0].delta is a string",
    ),
    "content a list of numbers": ([chunk({"content": [1]})], "choices[0].delta.content[0] is a number (1)"),
    "chunk a JSON string": ([chunk({"content": "a"}), "b"], "stream event 1: the chunk is a string ('b')"),
    "event not JSON": ([chunk({"content": "a"}), b"{nope"], "stream event 1 is not readable JSON"),
    "choices a string": ([{**chunk({}), "choices": "x"}], "stream event 0: choices is a string ('x')"),
    "usage a list": (
        [chunk({"content": "a"}), {**USAGE, "usage": [1]}],
        "stream event 1: usage is a list of 1",
    ),
    "error event": (
        [chunk({"content": "a"}), {"error": {"message": "engine died"}}],
        "answered with an error: engine died",
    ),
    "no choices at all": ([USAGE], "streamed no choices"),
    "cut short": (  # content came, then the stream ended without a finish_reason
        [chunk({"content": "The answer is \\box"}), USAGE],
        "ended the stream before the reply finished (no finish_reason)",
    ),
}


@pytest.mark.parametrize("case", list(STREAM_REFUSED))
def test_a_malformed_stream_stops_the_episode_with_a_named_error_and_keeps_what_was_done(stub, case):
    events, expected = STREAM_REFUSED[case]
    stub.reply([chunk({"tool_calls": [part(0, "call_1", "add", '{"a": 2, "b": 3}')]}, "tool_calls"), USAGE])
    stub.reply(events)
    stub.reply([chunk({"content": "done"}, "stop")])
    traj = Agent(OpenAIBackend(stub.url, "m", max_retries=0, stream=True), [add]).run("2+3?")
    if expected is None:
        assert traj.stop_reason == "answer" and traj.steps[1].tool_calls[0].error == "bad_json"
        return
    assert traj.stop_reason == "error" and expected in traj.error, traj.error
    assert [m["role"] for m in traj.messages] == ["user", "assistant", "tool"]
    assert traj.messages[2]["content"] == "5" and traj.num_steps == 1


def test_streamed_parts_without_index_and_other_choices(stub):
    no_index = [
        {"id": "c1", "function": {"name": "add", "arguments": '{"a": 1, '}},
        {"function": {"arguments": '"b": 2}'}},
    ]
    stub.reply(
        [
            chunk({"tool_calls": no_index}),
            chunk({"tool_calls": [{"id": "c2", "function": {"name": "add", "arguments": {"a": 3, "b": 4}}}]}),
            {**chunk({}), "choices": [{"index": 1, "delta": {"content": "another choice"}}]},
            {**chunk({}), "choices": [{"index": 0, "finish_reason": "tool_calls"}]},  # no delta
            USAGE,
        ]
    )
    stub.reply([chunk({"content": "done"}, "stop")])
    traj = Agent(OpenAIBackend(stub.url, "m", max_retries=0, stream=True), [add]).run("q")
    assert traj.stop_reason == "answer" and traj.final == "done"
    first = traj.messages[1]
    assert first["content"] == "" and traj.steps[0].finish_reason == "tool_calls"
    assert [(c["id"], c["function"]["arguments"]) for c in first["tool_calls"]] == [
        ("c1", '{"a": 1, "b": 2}'),
        ("c2", '{"a": 3, "b": 4}'),
    ]
    assert [m["content"] for m in traj.messages if m["role"] == "tool"] == ["3", "7"]


# ------------------------------------------------------------------------------------------ scripted
SCRIPT_REFUSED = {
    "function is a string": ({"tool_calls": [{"function": "add"}]}, "tool_calls[0].function is a string"),
    "tool call null": ({"tool_calls": [None]}, "tool_calls[0] is null"),
    "tool_calls an object": ({"tool_calls": {"function": {"name": "add"}}}, "tool_calls is an object"),
    "content a number": ({"content": 3}, "content is a number (3)"),
    "reasoning a list": ({"reasoning_content": ["x"]}, "reasoning_content is a list of 1"),
    "arguments not JSON-able": (
        {"tool_calls": [{"function": {"name": "add", "arguments": {1, 2}}}]},
        "tool_calls[0].function.arguments is a set",
    ),
    "usage unknown key": ({"content": "x", "usage": {"prompt": 3}}, "usage has unknown keys ['prompt']"),
    "usage count negative": (
        {"content": "x", "usage": {"prompt_tokens": -1}},
        "usage.prompt_tokens is a number (-1)",
    ),
    "finish_reason a number": ({"content": "x", "finish_reason": 0}, "finish_reason is a number (0)"),
    "not a message": ("hello", "the message is a string ('hello')"),
}


@pytest.mark.parametrize("case", list(SCRIPT_REFUSED))
def test_a_malformed_script_is_refused_when_the_backend_is_built(case):
    reply, expected = SCRIPT_REFUSED[case]
    with pytest.raises(AgentError, match="scripted reply 2: ") as info:
        ScriptedBackend([answer("ok"), reply])
    assert expected in str(info.value)


@pytest.mark.parametrize("case", list(SCRIPT_REFUSED))
def test_a_malformed_reply_of_a_scripted_callable_stops_the_episode_with_error(case):
    reply, expected = SCRIPT_REFUSED[case]
    backend = ScriptedBackend([calls(("add", {"a": 2, "b": 3})), lambda messages, tools: reply])
    traj = Agent(backend, [add]).run("2+3?")
    assert traj.stop_reason == "error" and traj.error.startswith("scripted reply 2: ")
    assert expected in traj.error
    assert [m["role"] for m in traj.messages] == ["user", "assistant", "tool"] and traj.num_steps == 1


def test_a_script_that_is_not_a_list_is_refused():
    for script in ("hello", {"content": "x"}, 5):
        with pytest.raises(AgentError, match="a script is a list"):
            ScriptedBackend(script)


def test_scripted_broken_calls_are_answered_like_an_endpoint_s():
    script = [
        {"tool_calls": [{"function": {"name": "add", "arguments": [1]}}, {"function": {"arguments": "{}"}}]},
        {
            "content": [{"type": "text", "text": "do"}, {"type": "text", "text": "ne"}],
            "usage": {"total_tokens": 3},
        },
    ]
    traj = Agent(ScriptedBackend(script), [add]).run("q")
    assert traj.stop_reason == "answer" and traj.final == "done"
    assert [t.error for t in traj.steps[0].tool_calls] == ["bad_json", "unknown_tool"]
