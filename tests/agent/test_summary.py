"""The ``summary`` strategy (§4.4): the summarizer's prompt is made to fit with room for the summary,
it carries the rollout's reasoning (which §3.2.1 hides behind the request's user turn), a summary
cut at its budget is recorded, and a request that cannot fit resets as ``discard_all``."""

from __future__ import annotations

from helpers.agent import CountingBackend, answer, calls

from dsv32.agent import Agent, tool
from dsv32.agent.context import (
    OMITTED,
    REASONING_HEADER,
    SUMMARY_HEADER,
    SUMMARY_REQUEST,
    fit_summary_request,
    summary_request,
)

SYSTEM = {"role": "system", "content": "sys"}
echo = tool(lambda n: "x" * n, name="echo", schema={"type": "object"})


class ToolChars(CountingBackend):
    """10 tokens a message plus one per character of a tool result: leaving results out shrinks it."""

    def count_tokens(self, messages, tools, *, thinking=True) -> int:
        return sum(10 + (len(m["content"]) if m.get("role") == "tool" else 0) for m in messages)


def echoes(n: int, size: int = 100) -> list[dict]:
    return [{**calls(("echo", {"n": size})), "reasoning_content": f"thought {i}"} for i in range(n)]


def run(script: list[dict], backend_class=ToolChars, **options):
    backend = backend_class(script)
    # window 500, trigger 0.8: prompts over 400 tokens reset; four rounds of 120 tokens make 500
    agent = Agent(backend, [echo], system="sys", context_window=500, context="summary", **options)
    return backend, agent.run("task")


def test_the_summary_request_fits_with_room_for_the_summary_and_carries_the_reasoning():
    backend, traj = run([*echoes(4), answer("Echoed four times."), answer("done")])
    assert traj.stop_reason == "answer" and [s.kind for s in traj.steps] == ["act"] * 4 + ["summary", "act"]
    request = backend.calls[4]
    # 500 + 10 for the request; each result left out saves 100 − 44: two leave 398 ≤ 500 − 100
    assert backend.count_tokens(request.messages, []) == 398
    assert request.sampling == {"max_tokens": 100}  # the summary's budget: what the 0.8 trigger leaves
    shown = [m["content"] for m in request.messages if m["role"] == "tool"]
    assert shown == [OMITTED, OMITTED, "x" * 100, "x" * 100]  # the oldest results left out
    text = request.messages[-1]["content"]
    assert text.startswith(SUMMARY_REQUEST + REASONING_HEADER)
    assert [f"[turn {i + 1}]\nthought {i}" in text for i in range(4)] == [True] * 4
    (event,) = traj.context_events
    assert (event.step, event.tokens_before, event.tokens_after, event.removed) == (4, 500, 20, 8)
    assert (event.summary, event.left_out, event.summary_truncated, event.fallback) == (
        "Echoed four times.",
        2,
        False,
        None,
    )
    fresh = backend.calls[5].messages
    assert fresh == [SYSTEM, {"role": "user", "content": "task" + SUMMARY_HEADER + "Echoed four times."}]
    assert traj.steps[5].context_events == [event]


def test_the_summary_budget_is_the_replys_max_tokens_when_known():
    backend, traj = run([*echoes(4), answer("s"), answer("done")], sampling={"max_tokens": 60, "seed": 1})
    assert backend.calls[4].sampling == {"max_tokens": 60, "seed": 1}
    assert backend.count_tokens(backend.calls[4].messages, []) <= 500 - 60
    assert traj.context_events[0].left_out == 2


def test_a_summary_cut_at_its_budget_is_recorded_and_used():
    cut = {**answer("Echoed four"), "finish_reason": "length"}
    _, traj = run([*echoes(4), cut, answer("done")])
    (event,) = traj.context_events
    assert event.summary_truncated and event.summary == "Echoed four" and traj.stop_reason == "answer"
    assert traj.steps[4].finish_reason == "length"


def test_a_request_that_cannot_fit_resets_as_discard_all():
    # 10 tokens a message, window 100: leaving results out saves nothing, and the request overflows
    backend = CountingBackend([*echoes(4), *echoes(4), answer("done")])
    traj = Agent(backend, [echo], system="sys", context_window=100, context="summary").run("task")
    (event, *_) = traj.context_events
    assert (event.strategy, event.fallback, event.summary, event.removed) == (
        "summary",
        "discard_all",
        None,
        8,
    )
    assert "summary" not in [s.kind for s in traj.steps]  # no call was spent on it
    assert backend.calls[4].messages == [SYSTEM, {"role": "user", "content": "task"}]
    assert traj.stop_reason == "answer"


def test_the_reasoning_goes_in_the_request_only_in_thinking_mode():
    messages = [SYSTEM, {"role": "user", "content": "t"}, *({"role": "assistant", **e} for e in echoes(2))]
    messages.insert(3, {"role": "tool", "content": "r"})
    messages.append({"role": "tool", "content": "r"})
    request, omitted = summary_request(messages, 2, thinking=False)
    assert request[-1] == {"role": "user", "content": SUMMARY_REQUEST} and omitted == []
    # left out in order: tool results, then the oldest reasoning
    request, omitted = summary_request(messages, 2, thinking=True, drop=3)
    assert omitted == [3, 5] and "[turn 1]" not in request[-1]["content"]
    assert "left out to fit" in request[-1]["content"] and "[turn 2]\nthought 1" in request[-1]["content"]
    fitted = fit_summary_request(messages, 2, True, lambda m: len(m) < 100)
    assert fitted is not None and fitted[2] == 0
    assert fit_summary_request(messages, 2, True, lambda m: False) is None


def test_an_empty_summary_stops_with_context():
    _, traj = run([*echoes(4), {"content": "  "}])
    assert traj.stop_reason == "context" and [s.kind for s in traj.steps][-1] == "summary"


def test_a_summary_that_does_not_fit_under_the_limit_stops_with_context():
    class Chars(CountingBackend):  # 10 tokens a message plus one per character of content
        def count_tokens(self, messages, tools, *, thinking=True) -> int:
            return sum(10 + len(m.get("content") or "") for m in messages)

    backend = Chars([*echoes(4, size=500), {"content": "s" * 2000}])
    traj = Agent(backend, [echo], system="sys", context_window=2000, context="summary").run("task")
    (event,) = traj.context_events
    assert event.left_out == 3 and event.summary == "s" * 2000  # the request fitted, the summary not
    assert traj.stop_reason == "context" and event.tokens_after > 1600


def test_summary_calls_count_toward_max_steps():
    _, traj = run([*echoes(4), answer("summary"), *echoes(3)], max_steps=5)
    assert traj.stop_reason == "max_steps" and traj.num_steps == 5 and traj.steps[-1].kind == "summary"


def test_every_step_records_the_conversation_it_was_sent():
    """The transcript only grows; each step's ``visible`` spans (and the tool results it saw left
    out) rebuild exactly what the backend was sent, across summary and discard resets."""
    unreadable = {"reasoning_content": "r", "content": "<｜DSML｜invoke"}  # answered with an error
    for strategy in ("summary", "discard_75", "discard_all"):
        summarized = [answer("Echoed.")] if strategy == "summary" else []
        script = [*echoes(2), unreadable, *echoes(2), *summarized, *echoes(2), answer("done")]
        backend = ToolChars(script)
        agent = Agent(backend, [echo], system="sys", context_window=500, context=strategy, max_steps=20)
        traj = agent.run("task")
        assert traj.context_events and traj.stop_reason == "answer", (strategy, traj.stop_reason)
        for i, call in enumerate(backend.calls):
            assert traj.step_messages(i) == call.messages, (strategy, i)
    # the summary's request and reply are in the transcript, before the re-initiating task
    backend = ToolChars([*echoes(4), answer("Echoed four times."), answer("done")])
    traj = Agent(backend, [echo], system="sys", context_window=500, context="summary").run("task")
    summary_at = next(i for i, m in enumerate(traj.messages) if m.get("content") == "Echoed four times.")
    asked, reply, task = traj.messages[summary_at - 1 : summary_at + 2]
    assert asked["role"] == "user" and asked["content"].startswith(SUMMARY_REQUEST)
    assert reply["role"] == "assistant" and task["content"].endswith(SUMMARY_HEADER + "Echoed four times.")
    assert traj.steps[4].omitted == [3, 5] and traj.steps[5].visible == [
        [0, 1],
        [summary_at + 1, summary_at + 2],
    ]
