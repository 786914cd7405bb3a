"""The loop with a scripted backend: tool results, stop reasons, thinking context, events, logs."""

from __future__ import annotations

import json
import threading

import pytest
from helpers.agent import add, answer, calls

from dsv32.agent import Agent, AgentError, ScriptedBackend, Trajectory, tool


def test_several_calls_in_one_message_run_in_order_and_each_result_returns():
    order = []

    def note(text: str) -> str:
        """Write down a note."""
        order.append(text)
        return f"noted {text}"

    backend = ScriptedBackend(
        [calls(("note", {"text": "a"}), ("add", {"a": 2, "b": 3}), ("note", {"text": "b"})), answer("5")]
    )
    traj = Agent(backend, [note, add]).run("go")
    assert traj.stop_reason == "answer" and traj.final == "5"
    assert order == ["a", "b"]
    assistant, *results = traj.messages[1:5]
    ids = [c["id"] for c in assistant["tool_calls"]]
    assert len(set(ids)) == 3
    assert [(r["role"], r["tool_call_id"], r["content"]) for r in results] == [
        ("tool", ids[0], "noted a"),
        ("tool", ids[1], "5"),
        ("tool", ids[2], "noted b"),
    ]
    assert traj.messages[5] == {"role": "assistant", "content": "5", "reasoning_content": "done"}
    assert [t.name for t in traj.steps[0].tool_calls] == ["note", "add", "note"]
    # the second call saw all three results
    assert backend.calls[1].messages[-3:] == results


def test_call_ids_given_by_the_model_are_kept():
    reply = calls(("add", {"a": 1, "b": 1}))
    reply["tool_calls"][0]["id"] = "call_model_7"
    traj = Agent(ScriptedBackend([reply, answer("2")]), [add]).run("go")
    assert traj.messages[2]["tool_call_id"] == "call_model_7"


def test_bad_calls_never_stop_the_loop():
    release = threading.Event()

    def boom() -> str:
        raise RuntimeError("kaput")

    def hang() -> str:
        release.wait(10)
        return "late"

    script = [
        calls(("missing_tool", {})),
        calls(("add", '{"a": 1')),
        calls(("add", {"a": "one", "b": 2})),
        calls(("add", {"a": 1})),
        calls(("boom", {})),
        calls(("hang", {})),
        calls(("add", {"a": 1, "b": 2})),
        answer("3"),
    ]
    agent = Agent(ScriptedBackend(script), [add, boom, tool(hang, timeout_s=0.05)])
    traj = agent.run("go")
    release.set()
    assert traj.stop_reason == "answer" and traj.final == "3"
    kinds = [s.tool_calls[0].error for s in traj.steps[:-1]]
    assert kinds == [
        "unknown_tool",
        "bad_json",
        "invalid_arguments",
        "invalid_arguments",
        "exception",
        "timeout",
        None,
    ]
    results = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert results[0].startswith("Error: unknown tool 'missing_tool'")
    assert "b: Field required" in results[3]
    assert results[4] == "Error: boom raised RuntimeError: kaput"
    assert "timed out" in results[5]
    assert results[6] == "3"


def test_long_tool_output_reaches_the_model_truncated():
    traj = Agent(
        ScriptedBackend([calls(("big", {})), answer("ok")]),
        [tool(lambda: "y" * 500, name="big")],
        max_tool_output_chars=50,
    ).run("go")
    assert traj.messages[2]["content"].startswith("y" * 50 + "\n[... output truncated")
    assert traj.steps[0].tool_calls[0].truncated


def test_stop_reasons_answer_max_steps_error():
    loop = [calls(("add", {"a": 1, "b": 1}))] * 3
    traj = Agent(ScriptedBackend(loop), [add], max_steps=3).run("go")
    assert traj.stop_reason == "max_steps" and traj.final is None and traj.num_steps == 3
    assert traj.messages[-1]["role"] == "tool"  # the last calls were still answered

    traj = Agent(ScriptedBackend(loop[:1]), [add]).run("go")
    assert traj.stop_reason == "error" and "no reply 2" in traj.error and traj.num_steps == 1

    traj = Agent(ScriptedBackend([answer("hi")]), []).run("hello")
    assert (traj.stop_reason, traj.final, traj.total_steps) == ("answer", "hi", 1)


def test_thinking_context_keeps_reasoning_within_the_turn_and_drops_it_before_the_user_message():
    history = [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "old answer", "reasoning_content": "old reasoning"},
        {"role": "user", "content": "second question"},
    ]
    backend = ScriptedBackend(
        [calls(("add", {"a": 1, "b": 2})), calls(("add", {"a": 3, "b": 4})), answer("7")]
    )
    Agent(backend, [add]).run(history)
    for call in backend.calls:
        assert "reasoning_content" not in call.messages[1]  # dropped: before the last user message
        assert call.messages[1]["content"] == "old answer"
    third = backend.calls[2].messages
    assert [m.get("reasoning_content") for m in third if m["role"] == "assistant"][1:] == [
        "calling 1 tool(s)",
        "calling 1 tool(s)",
    ]  # kept across the tool calls of the current turn
    assert third[4]["role"] == "tool" and third[6]["role"] == "tool"  # calls and results stay

    chat = ScriptedBackend([answer("x")])
    Agent(chat, [], thinking=False).run(history)
    assert chat.calls[0].messages[1]["reasoning_content"] == "old reasoning"  # chat mode: untouched
    assert chat.calls[0].thinking is False


def test_task_forms_and_bad_setups():
    backend = ScriptedBackend([answer("a"), answer("b")])
    traj = Agent(backend, [], system="be brief").run("q")
    assert traj.messages[:2] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q"}]
    traj = Agent(backend, [], system="be brief").run([{"role": "user", "content": "q"}])
    assert traj.messages[0]["role"] == "system"
    with pytest.raises(AgentError, match="give one"):
        Agent(backend, [], system="x").run(
            [{"role": "system", "content": "y"}, {"role": "user", "content": "q"}]
        )
    with pytest.raises(AgentError, match="no user message"):
        Agent(backend, []).run([{"role": "system", "content": "y"}])
    with pytest.raises(AgentError, match="empty"):
        Agent(backend, []).run("  ")
    with pytest.raises(AgentError, match="unknown context strategy 'forget'"):
        Agent(backend, [], context="forget")
    with pytest.raises(AgentError, match="needs context_window"):
        Agent(backend, [], context="summary")
    with pytest.raises(AgentError, match="max_steps"):
        Agent(backend, [], max_steps=0)


def test_sampling_and_thinking_reach_the_backend():
    backend = ScriptedBackend([answer("a")])
    Agent(backend, [add], sampling={"temperature": 0.3}, thinking=True).run("q")
    assert backend.calls[0].sampling == {"temperature": 0.3}
    assert backend.calls[0].tools[0]["function"]["name"] == "add"


def test_events_follow_the_episode():
    events = []
    backend = ScriptedBackend([calls(("add", {"a": 1, "b": 2})), answer("3")])
    Agent(backend, [add], on_event=lambda kind, payload: events.append((kind, payload))).run("q")
    kinds = [k for k, _ in events]
    assert kinds == ["thread", "delta", "tool_call", "tool_result", "step", "delta", "delta", "step", "stop"]
    assert events[1][1] == {"kind": "reasoning", "text": "calling 1 tool(s)"}
    assert events[2][1]["name"] == "add" and json.loads(events[2][1]["arguments"]) == {"a": 1, "b": 2}
    assert events[3][1]["content"] == "3" and events[3][1]["ok"]
    assert events[6][1] == {"kind": "content", "text": "3"}
    assert events[-1][1]["stop_reason"] == "answer"


def test_trajectory_logs_and_round_trip(tmp_path):
    backend = ScriptedBackend(
        [
            {
                **calls(("add", {"a": 1, "b": 2}), ("nope", {})),
                "usage": {"prompt_tokens": 100, "completion_tokens": 7},
            },
            {**answer("3"), "usage": {"prompt_tokens": 130, "completion_tokens": 3, "cached_tokens": 90}},
        ]
    )
    traj = Agent(backend, [add]).run("q")
    assert (traj.prompt_tokens, traj.completion_tokens, traj.total_tokens) == (230, 10, 240)
    lines = [json.loads(x) for x in traj.write_jsonl(tmp_path / "steps.jsonl").read_text().splitlines()]
    assert len(lines) == 3
    assert lines[0]["prompt_tokens"] == 100 and lines[0]["completion_tokens"] == 7
    assert lines[0]["tools"] == [
        {"name": "add", "ok": True, "error": None, "truncated": False},
        {"name": "nope", "ok": False, "error": "unknown_tool", "truncated": False},
    ]
    assert lines[1]["cached_tokens"] == 90 and lines[1]["finish_reason"] == "stop"
    assert lines[0]["latency_s"] >= 0 and "context_events" in lines[0]
    assert lines[2]["episode"]["stop_reason"] == "answer" and lines[2]["episode"]["total_tokens"] == 240
    again = Trajectory.load(traj.save(tmp_path / "t.json"))
    assert again == traj


def test_a_backend_that_cannot_render_the_conversation_ends_the_episode_with_its_trajectory():
    """A chat template refusing a ``tool`` turn (the alternation checks of Llama-2/Mistral/Gemma-style
    templates) raises AgentError while the prompt is rendered, after a tool has already run."""

    def refuse(messages, tools):
        raise AgentError("the model's chat template cannot render this conversation: roles must alternate")

    for options in ({}, {"context_window": 1000, "context": "discard_all"}):
        backend = ScriptedBackend([calls(("add", {"a": 1, "b": 2})), refuse])
        if options:  # counting the prompt is where a local backend renders it first
            counted = []

            def count(messages, tools, *, thinking=True, counted=counted):
                counted.append(len(messages))
                if len(counted) > 1:
                    refuse(messages, tools)
                return 10

            backend.count_tokens = count
        traj = Agent(backend, [add], **options).run("1 + 2?")
        assert traj.stop_reason == "error" and "roles must alternate" in traj.error
        assert traj.messages[-1] == {"role": "tool", "tool_call_id": "call_0_0_0", "content": "3"}
        assert traj.num_steps == 1 and traj.final is None
