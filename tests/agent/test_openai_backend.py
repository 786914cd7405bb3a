"""OpenAIBackend against a stub Chat Completions server on 127.0.0.1, through the real openai client:
plain and streamed replies, ``reasoning`` vs ``reasoning_content``, retries, and what is sent back."""

from __future__ import annotations

import pytest
from helpers.agent import add, chunk, completion

from dsv32.agent import Agent, BackendError, OpenAIBackend

TOOL_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
}


def test_plain_reply_with_tool_calls_reasoning_and_usage(stub):
    stub.reply(
        completion(
            {"content": None, "reasoning_content": "I should add.", "tool_calls": [TOOL_CALL]},
            "tool_calls",
            {
                "prompt_tokens": 80,
                "completion_tokens": 9,
                "total_tokens": 89,
                "prompt_tokens_details": {"cached_tokens": 64},
            },
        )
    )
    backend = OpenAIBackend(stub.url, "deepseek-v3.2", api_key="k", temperature=0.7, top_k=20)
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    out = backend.complete(
        [{"role": "user", "content": "2+3?"}], tools, thinking=True, sampling={"max_tokens": 99}
    )
    assert out.message == {
        "role": "assistant",
        "content": "",
        "reasoning_content": "I should add.",
        "tool_calls": [TOOL_CALL],
    }
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.cached_tokens) == (80, 9, 64)
    assert out.finish_reason == "tool_calls"
    (sent,) = stub.requests
    assert sent["model"] == "deepseek-v3.2" and sent["tools"] == tools
    assert sent["temperature"] == 0.7 and sent["max_tokens"] == 99 and sent["top_k"] == 20  # extra_body
    assert sent["chat_template_kwargs"] == {"thinking": True}
    # the estimate is calibrated by the reported prompt size
    assert backend.count_tokens([{"role": "user", "content": "2+3?"}], tools) == 80


def test_reasoning_field_instead_of_reasoning_content(stub):
    stub.reply(completion({"content": "5", "reasoning": "2 plus 3"}))
    out = OpenAIBackend(stub.url, "m").complete([{"role": "user", "content": "2+3?"}], [], thinking=False)
    assert out.message == {"role": "assistant", "content": "5", "reasoning_content": "2 plus 3"}
    assert stub.requests[0]["chat_template_kwargs"] == {"thinking": False}
    assert "tools" not in stub.requests[0]


def test_streamed_reply_is_assembled_and_passed_on_as_it_arrives(stub):
    stub.reply(
        [
            chunk({"role": "assistant", "reasoning": "Let me "}),
            chunk({"reasoning": "add."}),
            chunk({"content": "Calling."}),
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_9",
                            "type": "function",
                            "function": {"name": "add", "arguments": '{"a": '},
                        }
                    ]
                }
            ),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '2, "b": 3}'}}]}),
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 1,
                            "id": "call_10",
                            "type": "function",
                            "function": {"name": "add", "arguments": "{}"},
                        }
                    ]
                }
            ),
            chunk({}, "tool_calls"),
            chunk(None, usage={"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52}),
        ]
    )
    deltas = []
    backend = OpenAIBackend(stub.url, "m", stream=True)
    out = backend.complete(
        [{"role": "user", "content": "2+3?"}], [], on_delta=lambda k, t: deltas.append((k, t))
    )
    assert deltas == [("reasoning", "Let me "), ("reasoning", "add."), ("content", "Calling.")]
    assert out.message["reasoning_content"] == "Let me add." and out.message["content"] == "Calling."
    assert out.message["tool_calls"] == [
        {"id": "call_9", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
        {"id": "call_10", "type": "function", "function": {"name": "add", "arguments": "{}"}},
    ]
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.finish_reason) == (40, 12, "tool_calls")
    assert stub.requests[0]["stream"] is True and stub.requests[0]["stream_options"] == {
        "include_usage": True
    }


def test_429_then_success_is_retried(stub):
    error = {"error": {"message": "slow down", "type": "rate_limit"}}
    stub.reply(error, 429, **{"retry-after-ms": "1"})
    stub.reply(error, 503, **{"retry-after-ms": "1"})
    stub.reply(completion({"content": "ok", "reasoning_content": "r"}))
    out = OpenAIBackend(stub.url, "m", max_retries=3).complete([{"role": "user", "content": "q"}], [])
    assert out.message["content"] == "ok" and len(stub.requests) == 3


def test_failure_after_the_retries_stops_the_episode_with_error(stub):
    for _ in range(2):
        stub.reply({"error": {"message": "overloaded"}}, 500, **{"retry-after-ms": "1"})
    traj = Agent(OpenAIBackend(stub.url, "m", max_retries=1), [add]).run("q")
    assert traj.stop_reason == "error" and "HTTP 500" in traj.error and "overloaded" in traj.error
    assert "after up to 1 retries" in traj.error and len(stub.requests) == 2
    stub.reply({"error": {"message": "bad key"}}, 401)
    with pytest.raises(BackendError, match="check api_key") as info:
        OpenAIBackend(stub.url, "m", max_retries=3).complete([{"role": "user", "content": "q"}], [])
    assert "retries" not in str(info.value) and len(stub.requests) == 3  # a 401 is not retried


def test_reasoning_goes_back_within_the_tool_turn_and_is_dropped_across_user_turns(stub):
    stub.reply(
        completion({"content": "", "reasoning_content": "think 1", "tool_calls": [TOOL_CALL]}, "tool_calls")
    )
    stub.reply(completion({"content": "5", "reasoning_content": "think 2"}))
    agent = Agent(OpenAIBackend(stub.url, "m"), [add])
    first = agent.run("2+3?")
    assert first.final == "5"
    second_request = stub.requests[1]["messages"]
    assert second_request[1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [TOOL_CALL],
        "reasoning_content": "think 1",
    }
    assert second_request[2] == {"role": "tool", "tool_call_id": "call_1", "content": "5"}

    stub.reply(completion({"content": "6", "reasoning_content": "think 3"}))
    agent.run([*first.messages, {"role": "user", "content": "and 3+3?"}])
    third_request = stub.requests[2]["messages"]
    assert [m["role"] for m in third_request] == ["user", "assistant", "tool", "assistant", "user"]
    assert all("reasoning_content" not in m for m in third_request)  # a new user turn drops it
    assert third_request[1]["tool_calls"] == [TOOL_CALL]  # calls and results stay


def test_chat_mode_sends_no_reasoning(stub):
    stub.reply(completion({"content": "ok"}))
    history = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "reasoning_content": "r", "tool_calls": [TOOL_CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]
    OpenAIBackend(stub.url, "m").complete(history, [], thinking=False)
    assert "reasoning_content" not in stub.requests[0]["messages"][1]


def test_the_token_estimate_of_a_growing_context_equals_a_fresh_estimate():
    from dsv32.agent.backends.base import TokenEstimator

    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    kept = TokenEstimator()
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "x" * 40}]
    for i in range(6):  # the loop appends: each estimate adds only the new messages
        messages.append({"role": "assistant", "content": "y" * (10 * i), "reasoning_content": "z" * i})
        messages.append({"role": "tool", "content": "r" * 7})
        assert kept(messages, tools) == TokenEstimator()(messages, tools)
    # a context strategy builds a new, shorter list: counted from the start again
    shorter = [messages[0], {"role": "user", "content": "summary " * 5}, messages[-1]]
    assert kept(shorter, tools) == TokenEstimator()(shorter, tools) < kept(messages, tools)
    assert kept([], ()) == 0
