"""The window holds the prompt and the reply: context management keeps the reply's ``max_tokens``
free, an endpoint's refusal for the context length is a full context (managed, or ``context``), and
the token estimate of an endpoint errs high on digits and symbols and is anchored to its counts."""

from __future__ import annotations

import random

import pytest
from helpers.agent import CountingBackend, add, answer, calls, completion

from dsv32.agent import Agent, OpenAIBackend
from dsv32.agent.backends.base import TokenEstimator

VLLM_REFUSAL = {
    "object": "error",
    "message": "This model's maximum context length is 2048 tokens. However, you requested 2100 tokens "
    "(1100 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.",
    "type": "BadRequestError",
    "param": None,
    "code": 400,
}


def rounds(n: int) -> list[dict]:
    return [calls(("add", {"a": i, "b": 1})) for i in range(n)] + [answer("done")]


@pytest.mark.parametrize(
    ("strategy", "sizes"),
    [
        ("discard_all", [2, 4, 6, 2, 4, 6]),  # 10 tokens a message: 80 > 100 − 30 resets
        ("none", [2, 4, 6]),  # stops where 8 messages leave less than 30 tokens for the reply
    ],
)
def test_the_reply_budget_is_kept_free_in_the_window(strategy, sizes):
    backend = CountingBackend(rounds(5))
    options = dict(context_window=100, context=strategy, sampling={"max_tokens": 30})
    traj = Agent(backend, [add], system="sys", **options).run("task")
    assert [len(c.messages) for c in backend.calls] == sizes
    assert traj.stop_reason == ("answer" if strategy == "discard_all" else "context")
    # without a known reply budget the trigger is 0.8 · window (and the whole window unmanaged)
    backend = CountingBackend(rounds(5))
    Agent(backend, [add], system="sys", context_window=100, context="discard_all").run("task")
    assert [len(c.messages) for c in backend.calls][:5] == [2, 4, 6, 8, 2]


def test_a_reply_budget_as_large_as_the_window_means_what_the_prompt_leaves():
    # the paper's evaluation: 128K generation length in a 128K window
    backend = CountingBackend(rounds(5))
    options = dict(context_window=100, context="discard_all", sampling={"max_tokens": 100})
    Agent(backend, [add], system="sys", **options).run("task")
    assert [len(c.messages) for c in backend.calls][:5] == [2, 4, 6, 8, 2]  # the 0.8 trigger alone


def test_a_refusal_for_the_context_length_is_managed_like_a_full_context(stub):
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    stub.reply(completion({"content": "", "tool_calls": [call]}))
    stub.reply(VLLM_REFUSAL, 400)
    stub.reply(completion({"content": "5"}))
    backend = OpenAIBackend(stub.url, "m", max_retries=0, max_tokens=1000)
    traj = Agent(backend, [add], context_window=2048, context="discard_all").run("2 + 3?")
    assert (traj.stop_reason, traj.final, traj.num_steps) == ("answer", "5", 2)
    (event,) = traj.context_events
    assert event.strategy == "discard_all" and event.tokens_before == 1100 and event.removed == 2
    assert [m["role"] for m in stub.requests[2]["messages"]] == ["user"]
    # unmanaged, or with no window given: the episode stops with "context", the refusal kept
    for options in ({"context_window": 2048}, {}):
        stub.reply(VLLM_REFUSAL, 400)
        traj = Agent(OpenAIBackend(stub.url, "m", max_retries=0, max_tokens=1000), [add], **options).run("q")
        assert traj.stop_reason == "context" and "maximum context length" in traj.error


def test_the_refusal_is_typed_and_calibrates_the_estimate(stub):
    from dsv32.agent import ContextLengthError

    stub.reply({"error": {"message": "too long", "code": "context_length_exceeded"}}, 400)
    backend = OpenAIBackend(stub.url, "m", max_retries=0)
    messages = [{"role": "user", "content": "x"}]
    with pytest.raises(ContextLengthError) as info:
        backend.complete(messages, [])
    assert info.value.prompt_tokens is None
    stub.reply(VLLM_REFUSAL, 400)
    with pytest.raises(ContextLengthError) as info:
        backend.complete(messages, [])
    assert info.value.prompt_tokens == 1100 and backend.count_tokens(messages, []) == 1100
    stub.reply({"error": {"message": "unknown field 'foo'"}}, 400)  # any other 400 is an error
    traj = Agent(OpenAIBackend(stub.url, "m", max_retries=0), []).run("q")
    assert traj.stop_reason == "error" and "HTTP 400" in traj.error


def test_the_estimate_errs_high_on_digits_and_symbols():
    random.seed(0)
    digits = "".join(random.choice("0123456789") for _ in range(3000))
    estimate = TokenEstimator()([{"role": "user", "content": digits}])
    assert estimate >= 3000  # digit-splitting tokenizers (Llama, SmolLM2) spend one token a digit
    assert TokenEstimator()([{"role": "user", "content": "word " * 400}]) >= 400


def test_the_estimate_of_a_growing_prompt_is_the_reported_count_plus_what_was_added():
    estimate = TokenEstimator()
    messages = [{"role": "user", "content": "q" * 100}]
    estimate.calibrate(messages, [], 1000)  # e.g. a long system prompt the estimate knew nothing of
    added = [{"role": "assistant", "content": "", "tool_calls": calls(("add", {"a": 1}))["tool_calls"]}]
    added.append({"role": "tool", "content": "12345678"})
    grown = messages + added
    alone = TokenEstimator()(added)
    assert estimate(grown) == 1000 + alone  # the new part is estimated on its own, not scaled
    # a list that does not extend the reported prompt (a reset) is scaled by reported / estimated
    assert estimate([{"role": "user", "content": "q" * 100}]) == 1000


def test_a_window_sized_reply_budget_is_sent_as_what_the_prompt_leaves(stub):
    # An endpoint refuses prompt + max_tokens past its window: the paper's 128K generation length in a
    # 128K window is sent as the window less the prompt's tokens, each call.
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    stub.reply(completion({"content": "", "tool_calls": [call]}))
    stub.reply(completion({"content": "5"}))
    backend = OpenAIBackend(stub.url, "m", max_retries=0, max_tokens=2048)
    traj = Agent(backend, [add], context_window=2048).run("2 + 3?")
    assert traj.stop_reason == "answer"
    sent = [r["max_tokens"] for r in stub.requests]
    assert len(sent) == 2 and all(1900 < n < 2048 for n in sent)  # prompts of a few dozen tokens
    # a budget below the window is the caller's: sent as it is
    stub.reply(completion({"content": "5"}))
    Agent(OpenAIBackend(stub.url, "m", max_retries=0, max_tokens=500), [add], context_window=2048).run("q")
    assert stub.requests[-1]["max_tokens"] == 500
