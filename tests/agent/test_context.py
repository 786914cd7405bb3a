"""Test-time context management (§4.4): when each strategy triggers, what it keeps and drops, and
the budget every trajectory reports."""

from __future__ import annotations

import pytest
from helpers.agent import CountingBackend, add, answer, calls

from dsv32.agent import Agent, tool
from dsv32.agent.context import (
    discard_rounds,
    discarded_count,
    fewest_steps,
    tool_rounds,
)

SYSTEM = {"role": "system", "content": "sys"}


def rounds_script(n: int, final: str = "done") -> list[dict]:
    return [calls(("add", {"a": i, "b": 1})) for i in range(n)] + [answer(final)]


def agent(backend, strategy: str, **kw) -> Agent:
    # 10 tokens per message, window 100, trigger 0.8: a prompt of 9+ messages triggers
    return Agent(backend, [add], system="sys", context_window=100, context=strategy, **kw)


def sent_rounds(messages: list[dict]) -> list[int]:
    """The ``a`` argument of every round in a prompt (which rounds it holds)."""
    import json

    return [
        json.loads(m["tool_calls"][0]["function"]["arguments"])["a"] for m in messages if m.get("tool_calls")
    ]


def test_rounds_and_discard_counts():
    msgs = [SYSTEM, {"role": "user", "content": "t"}]
    for i in range(4):
        msgs += [
            {"role": "assistant", **calls(("add", {"a": i, "b": 1}))},
            {"role": "tool", "content": str(i)},
        ]
    assert tool_rounds(msgs, 2) == [(2, 4), (4, 6), (6, 8), (8, 10)]
    assert [discarded_count(n, 0.75) for n in (0, 1, 2, 3, 4, 10, 100)] == [0, 1, 1, 2, 3, 7, 75]
    kept, removed = discard_rounds(msgs, 2, 0.75)
    assert removed == 6 and kept == msgs[:2] + msgs[8:]
    kept, removed = discard_rounds(msgs, 2, 1.0)
    assert removed == 8 and kept == msgs[:2]
    assert fewest_steps(["answer", "answer", "max_steps"], [5, 3, 1]) == 1
    assert fewest_steps(["answer", "answer"], [3, 3]) == 0
    assert fewest_steps(["context", "max_steps"], [2, 9]) == 0


@pytest.mark.parametrize("strategy", ["none", "parallel_fewest_step"])
def test_the_unmanaged_baselines_use_the_whole_window_and_stop_when_it_is_full(strategy):
    # window 110: prompts of 90 and 100 tokens are over the 0.8 trigger (88) but still fit
    backend = CountingBackend(rounds_script(10) * 2)
    traj = Agent(backend, [add], system="sys", context_window=110, context=strategy, parallel=1).run("task")
    assert [len(c.messages) for c in backend.calls] == [2, 4, 6, 8, 10]  # 12 messages = 120 > 110
    assert traj.stop_reason == "context" and traj.final is None
    assert traj.context_events == []
    # one more round of room and the same script answers
    backend = CountingBackend(rounds_script(4))
    traj = Agent(backend, [add], system="sys", context_window=110, context=strategy, parallel=1).run("t")
    assert traj.stop_reason == "answer" and len(backend.calls[-1].messages) == 10


def test_a_prompt_that_fills_the_window_exactly_stops_the_unmanaged_baseline():
    backend = CountingBackend(rounds_script(10))
    traj = agent(backend, "none").run("task")  # window 100: 10 messages = 100 tokens leave no room
    assert [len(c.messages) for c in backend.calls] == [2, 4, 6, 8]
    assert traj.stop_reason == "context"


def test_the_trigger_fraction_is_a_parameter():
    backend = CountingBackend(rounds_script(10))
    traj = agent(backend, "discard_all", context_trigger=0.5, max_steps=4).run("task")
    assert [len(c.messages) for c in backend.calls] == [2, 4, 2, 4]  # 60 > 50 resets
    assert [e.tokens_before for e in traj.context_events] == [60]


def test_discard_75_removes_the_oldest_rounds_and_keeps_the_newest():
    backend = CountingBackend(rounds_script(6))
    traj = agent(backend, "discard_75").run("task")
    assert traj.stop_reason == "answer" and traj.final == "done"
    prompts = [c.messages for c in backend.calls]
    assert [len(p) for p in prompts] == [2, 4, 6, 8, 4, 6, 8]
    assert sent_rounds(prompts[3]) == [0, 1, 2]
    assert sent_rounds(prompts[4]) == [3]  # rounds 0-2 discarded (3 of 4), round 3 kept
    assert prompts[4][:2] == [SYSTEM, {"role": "user", "content": "task"}]
    assert prompts[4][2]["reasoning_content"] == "calling 1 tool(s)"  # a kept round keeps its reasoning
    (event,) = traj.context_events
    assert (event.step, event.strategy, event.tokens_before, event.tokens_after, event.removed) == (
        4, "discard_75", 100, 40, 6,
    )  # fmt: skip
    assert traj.steps[4].context_events == [event]
    # the transcript keeps everything that happened
    assert sent_rounds(traj.messages) == [0, 1, 2, 3, 4, 5]


def test_discard_all_keeps_only_the_system_prompt_and_the_task():
    backend = CountingBackend(rounds_script(6))
    traj = agent(backend, "discard_all").run("task")
    prompts = [c.messages for c in backend.calls]
    assert [len(p) for p in prompts] == [2, 4, 6, 8, 2, 4, 6]
    assert prompts[4] == [SYSTEM, {"role": "user", "content": "task"}]
    (event,) = traj.context_events
    assert (event.tokens_before, event.tokens_after, event.removed) == (100, 20, 8)
    assert traj.stop_reason == "answer" and traj.num_steps == 7


class ContentCounting(CountingBackend):
    """A prompt costs 10 tokens per message plus one per character of content."""

    def count_tokens(self, messages, tools, *, thinking=True) -> int:
        return sum(10 + len(m.get("content") or "") for m in messages)


def test_a_reset_that_does_not_fit_stops_with_context():
    # the newest round's result is too big: discard_75 keeps it, and the prompt is still over
    echo = tool(lambda n: "x" * n, name="echo", schema={"type": "object"})
    script = [calls(("echo", {"n": 1})), calls(("echo", {"n": 1})), calls(("echo", {"n": 70})), answer("no")]
    backend = ContentCounting(script)
    traj = Agent(backend, [echo], context_window=100, context="discard_75").run("task")
    assert traj.stop_reason == "context" and len(backend.calls) == 3
    (event,) = traj.context_events
    assert (event.tokens_before, event.tokens_after, event.removed) == (
        146,
        104,
        4,
    )  # 14 + 21 + 21 + 90 → 14 + 90
    # nothing to discard at all: the first prompt is already too big
    backend = CountingBackend(rounds_script(1), per_message=50)
    traj = agent(backend, "discard_75").run("task")
    assert traj.stop_reason == "context" and traj.num_steps == 0 and not backend.calls
    assert traj.error.startswith("the first prompt (system prompt, task and tool schemas) holds ")
    assert "the discard_75 strategy left nothing more to drop; raise context_window" in traj.error


def test_parallel_fewest_step_picks_the_shortest_finished_thread():
    script = rounds_script(2, "slow") + rounds_script(0, "fast") + rounds_script(10)
    backend = CountingBackend(script)
    traj = Agent(
        backend, [add], context="parallel_fewest_step", parallel=3, context_window=100, system="sys"
    ).run("task")
    assert traj.final == "fast" and traj.stop_reason == "answer" and traj.num_steps == 1
    assert [(t.thread, t.stop_reason, t.steps, t.final) for t in traj.threads] == [
        (0, "answer", 3, "slow"),
        (1, "answer", 1, "fast"),
        (2, "context", 4, None),  # the third thread ran into the window (no reset in this baseline)
    ]
    assert traj.total_steps == 8
    assert traj.total_tokens == sum(t.tokens for t in traj.threads)
    assert traj.strategy == "parallel_fewest_step"
    assert traj.context_events == []


@pytest.mark.parametrize("strategy", ["none", "summary", "discard_75", "discard_all"])
def test_budget_is_the_sum_over_steps(strategy):
    traj = agent(CountingBackend([*rounds_script(6)[:-1], answer("s"), *rounds_script(6)]), strategy).run("t")
    assert traj.total_steps == traj.num_steps
    assert traj.total_tokens == sum(s.prompt_tokens + s.completion_tokens for s in traj.steps) > 0


def test_each_thread_of_parallel_fewest_step_gets_its_own_seed():
    backend = CountingBackend([answer("a")] * 3)
    Agent(backend, [add], context="parallel_fewest_step", parallel=3, sampling={"seed": 7}).run("task")
    assert [c.sampling["seed"] for c in backend.calls] == [7, 8, 9]  # seed + thread, as vLLM's choices


def test_a_first_prompt_over_the_window_says_what_did_not_fit():
    backend = CountingBackend(rounds_script(1), per_message=50)
    traj = Agent(backend, [add], system="sys", context_window=90, sampling={"max_tokens": 10}).run("task")
    assert traj.stop_reason == "context" and traj.num_steps == 0 and not backend.calls
    assert traj.error == (
        "the first prompt (system prompt, task and tool schemas) holds 100 tokens, over the limit of 80: the "
        "90-token context_window less 10 token(s) kept for the reply (max_tokens); raise context_window, "
        "lower max_tokens or shorten the task"
    )
