"""Cold-start conversations: reference solutions played through the real tools and kept only when
verified; teacher episodes filtered by the verifier; the Appendix B prompts; rows that SFT reads."""

from __future__ import annotations

import json
import os
from typing import ClassVar

import pytest

from dsv32.chat import reasoning_agent_system_prompt
from dsv32.cli import main
from dsv32.envs.base import Environment, Reward, Task, tool_call, tool_schema
from dsv32.synth.coldstart import add_reasoning, build_coldstart
from dsv32.synth.records import SynthError


class AddEnv(Environment):
    """``add(a, b)``; the answer must be the sum. Task info ``wrong_reference`` breaks the reference."""

    name = "adder"

    def reset(self, task):
        self.task = task
        return [{"role": "system", "content": "Use add."}, {"role": "user", "content": task.prompt}]

    def tools(self):
        n = {"type": "integer"}
        return [tool_schema("add", "Add two integers.", {"a": n, "b": n})]

    def call(self, name, arguments):
        return str(arguments["a"] + arguments["b"]) if name == "add" else "error: unknown tool"

    def reward(self, trajectory):
        ok = (trajectory.final or "").strip() == str(self.task.answer)
        return Reward(float(ok), {"correct": float(ok)}, "")

    def reference(self, task):
        a, b = task.info["a"], task.info["b"]
        call = {"role": "assistant", "content": "", "tool_calls": [tool_call("add", {"a": a, "b": b}, "r0")]}
        answer = a + b + (1 if task.info.get("wrong_reference") else 0)
        return [call, {"role": "assistant", "content": str(answer)}]


def _tasks(n=4, wrong=()):
    return [
        Task(
            f"t{i}",
            f"{i} + {10 * i}?",
            str(11 * i),
            "math",
            {"a": i, "b": 10 * i, "wrong_reference": i in wrong},
        )
        for i in range(n)
    ]


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_only_verified_references_are_kept_with_real_tool_results(tmp_path):
    out = tmp_path / "cold.jsonl"
    report = build_coldstart(AddEnv, _tasks(4, wrong={1, 3}), out, prompt="env", workers=2)
    assert (report.kept, report.rejected, report.tasks_with_a_kept_row) == (2, 2, 2)
    assert report.reasons == {"reference not verified (reward 0)": 2}
    rows = _rows(out)
    assert [r["id"] for r in rows] == ["t0", "t2"]
    row = rows[1]
    roles = [m["role"] for m in row["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert row["messages"][3]["content"] == "22"  # what the tool returned, not a made-up text
    assert row["tools"][0]["function"]["name"] == "add"
    assert all(m.get("reasoning_content") for m in row["messages"] if m["role"] == "assistant")
    assert "returned 22" in row["messages"][4]["reasoning_content"]
    assert row["meta"] == {"source": "reference", "reward": 1.0, "task": "t2"}


def test_appendix_b_prompts_replace_the_system_message(tmp_path):
    build_coldstart(AddEnv, _tasks(1), tmp_path / "a.jsonl", prompt="reasoning_agent")
    row = _rows(tmp_path / "a.jsonl")[0]
    assert row["messages"][0]["content"] == reasoning_agent_system_prompt(AddEnv().tools())
    assert "tools" not in row  # Table 8 carries the tool descriptions itself
    build_coldstart(AddEnv, _tasks(1), tmp_path / "b.jsonl", prompt="bare")
    row = _rows(tmp_path / "b.jsonl")[0]
    assert row["messages"][0]["content"] == "Use add." and "tools" not in row
    with pytest.raises(SynthError, match="not one of"):
        build_coldstart(AddEnv, _tasks(1), tmp_path / "c.jsonl", prompt="fancy")


class FakeTeacher:
    """A backend spec whose agent adds with the tool and answers right only for even tasks."""

    label = "fake-teacher"
    thinking = True
    sampling: ClassVar[dict] = {}

    def make(self):
        from dsv32.agent import ScriptedBackend

        def act(messages, tools):
            n = int(messages[1]["content"].split(" ")[0])
            return {
                "content": "",
                "reasoning_content": "add",
                "tool_calls": [
                    {"type": "function", "function": {"name": "add", "arguments": {"a": n, "b": 10 * n}}}
                ],
            }

        def answer(messages, tools):
            n = int(messages[1]["content"].split(" ")[0])
            return {"content": str(11 * n if n % 2 == 0 else 0), "reasoning_content": "done"}

        return ScriptedBackend([act, answer])


def test_teacher_episodes_are_filtered_by_the_verifier(tmp_path):
    out = tmp_path / "t.jsonl"
    report = build_coldstart(AddEnv, _tasks(4), out, prompt="agent", teacher=FakeTeacher(), samples=2)
    assert (report.kept, report.rejected) == (4, 4)
    rows = _rows(out)
    assert sorted({r["id"] for r in rows}) == ["t0", "t2"]
    assert all(r["meta"]["source"] == "fake-teacher" for r in rows)
    assert rows[0]["messages"][-1]["content"] == "0"  # t0: 0 + 0 = 0, verified


def test_add_reasoning_keeps_existing_reasoning():
    messages = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "mine",
            "tool_calls": [tool_call("f", {}, "x")],
        },
        {"role": "tool", "tool_call_id": "x", "content": "42\nmore"},
        {"role": "assistant", "content": "42"},
    ]
    out = add_reasoning(messages)
    assert out[1]["reasoning_content"] == "mine" and out[3]["reasoning_content"] == "The tool returned 42."
    assert "reasoning_content" not in messages[3]  # the input is not changed


def test_interpreter_references_become_sft_conversations(tmp_path):
    """The real code interpreter: the kernel's output is in the transcript and SFT can tokenize it."""
    from dsv32.chat import add_v32_special_tokens
    from dsv32.envs.interpreter import InterpreterEnv, generate
    from dsv32.train.sft.data import encode_file
    from dsv32.train.sft.model import byte_level_tokenizer

    tasks = generate(2, seed=5, difficulty=1, categories=("multiplication",))
    report = build_coldstart(InterpreterEnv, tasks, tmp_path / "c.jsonl", prompt="env", workers=2)
    assert report.kept == 2
    rows = _rows(tmp_path / "c.jsonl")
    for row, task in zip(rows, tasks):
        assert row["messages"][3]["content"].strip() == task.answer
        assert f"\\boxed{{{task.answer}}}" in row["messages"][4]["content"]
    tok = byte_level_tokenizer()
    add_v32_special_tokens(tok)
    examples, counts = encode_file(tok, tmp_path / "c.jsonl", seq_len=10_000)
    assert counts["conversations"] == 2 and all(e.loss_tokens > 0 for e in examples)


def test_cli_writes_conversations_and_prints_the_report(tmp_path, capsys):
    tasks = tmp_path / "tasks.jsonl"
    rows = [
        {"id": "m1", "prompt": "Compute 12 × 34.", "answer": "408", "info": {"solution_code": "print(12*34)"}}
    ]
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "cold.jsonl"
    code = main(
        ["posttrain", "cold-start", "--env", "code-interpreter", "--tasks", str(tasks), "--out", str(out)]
    )
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["kept"] == 1 and printed["rejected"] == 0
    assert _rows(out)[0]["messages"][3]["content"].strip() == "408"


class DownTeacher(FakeTeacher):
    """A teacher whose endpoint fails every call (the backend raises after its retries)."""

    label = "down-teacher"

    def make(self):
        from dsv32.agent import ScriptedBackend

        return ScriptedBackend([])


class CountingEnv(AddEnv):
    made = 0

    def __init__(self):
        super().__init__()
        type(self).made += 1


def test_an_existing_out_is_replaced_only_when_asked_and_never_by_nothing(tmp_path):
    out = tmp_path / "cold.jsonl"
    build_coldstart(AddEnv, _tasks(2), out, prompt="bare")
    before = out.read_bytes()
    CountingEnv.made = 0
    with pytest.raises(SynthError, match=r"cold\.jsonl exists; pass --overwrite to replace it"):
        build_coldstart(CountingEnv, _tasks(2), out, prompt="bare")
    assert CountingEnv.made == 0  # refused before any episode
    with pytest.raises(
        SynthError, match=r"every episode \(4\) stopped with an error \(first: the script has no"
    ):
        build_coldstart(
            AddEnv, _tasks(2), out, prompt="bare", teacher=DownTeacher(), samples=2, overwrite=True
        )
    with pytest.raises(
        SynthError, match=r"no conversation to write \(2 × reference not verified \(reward 0\)\)"
    ):
        build_coldstart(AddEnv, _tasks(2, wrong={0, 1}), out, prompt="bare", overwrite=True)
    assert out.read_bytes() == before
    report = build_coldstart(AddEnv, _tasks(3, wrong={0}), out, prompt="bare", overwrite=True)
    assert report.kept == 2 and [r["id"] for r in _rows(out)] == ["t1", "t2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cold.jsonl"]  # no temporary file left


def test_an_out_that_cannot_be_written_is_refused_before_any_episode(tmp_path):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-dir").mkdir()
    CountingEnv.made = 0
    with pytest.raises(
        SynthError, match=r"cannot write --out .*/a-file/sub/c\.jsonl: .*/a-file is not a directory"
    ):
        build_coldstart(CountingEnv, _tasks(1), tmp_path / "a-file" / "sub" / "c.jsonl")
    with pytest.raises(SynthError, match=r"a-dir is a directory; give the path of a JSONL file"):
        build_coldstart(CountingEnv, _tasks(1), tmp_path / "a-dir", overwrite=True)
    assert CountingEnv.made == 0 and list((tmp_path / "a-dir").iterdir()) == []


def test_a_write_that_fails_leaves_the_old_file(tmp_path):
    from dsv32.synth.coldstart import write_rows

    out = tmp_path / "cold.jsonl"
    write_rows(out, [{"id": "old"}])
    umask = os.umask(0o022)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask  # a data file others may read, as usual
    with pytest.raises(TypeError):
        write_rows(out, [{"id": "new"}, {"id": object()}])
    assert _rows(out) == [{"id": "old"}] and sorted(p.name for p in tmp_path.iterdir()) == ["cold.jsonl"]


def test_cli_refuses_to_overwrite_and_fails_when_every_episode_fails(tmp_path, capsys):
    out = tmp_path / "cs.jsonl"
    argv = ["posttrain", "cold-start", "--env", "code-interpreter", "--tasks", "smoke", "--limit", "2",
            "--prompt", "bare", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0 and len(_rows(out)) == 2
    before = out.read_bytes()
    capsys.readouterr()
    assert main([*argv, "--teacher", "openai:m@http://127.0.0.1:9/v1"]) == 2
    assert "cs.jsonl exists; pass --overwrite to replace it" in capsys.readouterr().err
    assert out.read_bytes() == before
