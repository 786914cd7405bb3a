"""``dsv32 agent run``: streamed to the terminal, trajectory and step log written; with an
OpenAI-compatible stub endpoint and with an environment's reference solution (bad input:
tests/cli/cases_agent.py)."""

from __future__ import annotations

import json

from helpers.agent import Counter, chunk

from dsv32.cli import main
from dsv32.envs.base import EnvSpec, Task, register


def test_run_against_an_endpoint_streams_and_writes_the_trajectory(stub, tmp_path, capsys):
    call = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
    }
    stub.reply([chunk({"reasoning_content": "Use add."}), chunk({"tool_calls": [call]}, "tool_calls")])
    stub.reply([chunk({"reasoning_content": "Got 5."}), chunk({"content": "It is 5."}, "stop")])
    out = tmp_path / "run"
    argv = ["agent", "run", "--base-url", stub.url, "--model", "m", "--task", "2+3?", "--out", str(out)]
    assert main([*argv, "--tool", "helpers.agent:add", "--system", "Be exact."]) == 0
    text = capsys.readouterr().out
    for piece in (
        "thinking: Use add.",
        '→ add({"a": 2, "b": 3})',
        "← 5",
        "answer: It is 5.",
        "■ answer",
        "stop: answer, steps: 2",
    ):
        assert piece in text
    trajectory = json.loads((out / "trajectory.json").read_text())
    assert trajectory["final"] == "It is 5." and trajectory["messages"][0] == {
        "role": "system",
        "content": "Be exact.",
    }
    lines = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    assert lines[0]["tools"][0]["name"] == "add" and lines[-1]["episode"]["stop_reason"] == "answer"
    assert stub.requests[0]["tools"][0]["function"]["name"] == "add"


def test_the_command_does_not_log_each_http_request(stub, tmp_path):
    import subprocess
    import sys

    stub.reply([chunk({"content": "hi"}, "stop")])
    argv = ["agent", "run", "--base-url", stub.url, "--model", "m", "--task", "hello", "--out", str(tmp_path)]
    code = "import sys; from dsv32.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "answer: hi" in done.stdout and "HTTP Request" not in done.stderr + done.stdout


def test_reference_backend_replays_an_environment(tmp_path, capsys):
    register(
        EnvSpec("agent-test-counter", "a counter", Counter, {"basic": lambda: [Task("t1", "Count to 3.", 3)]})
    )
    out = tmp_path / "ref"
    code = main(
        [
            "agent",
            "run",
            "--backend",
            "reference",
            "--env",
            "agent-test-counter",
            "--no-thinking",
            "--quiet",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    assert "stop: answer, steps: 2, tokens:" in capsys.readouterr().out
    assert json.loads((out / "trajectory.json").read_text())["final"] == "3"


def test_a_tool_module_in_the_current_directory_is_found(tmp_path, monkeypatch):
    import sys

    from dsv32.cli.agent import _load_tools

    (tmp_path / "my_local_tools.py").write_text("def triple(x: int) -> int:\n    return 3 * x\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "my_local_tools", raising=False)
    (triple,) = _load_tools(["my_local_tools:triple"])
    assert triple(4) == 12


def test_an_output_directory_that_cannot_be_made_fails_before_the_episode(stub, tmp_path, capsys):
    (tmp_path / "file").write_text("a file, not a directory")
    stub.reply([chunk({"content": "hi"}, "stop")])
    argv = ["agent", "run", "--base-url", stub.url, "--model", "m", "--task", "hello", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "file" / "run")]) == 2
    assert "cannot write the output directory" in capsys.readouterr().err
    assert stub.requests == []  # no model call was spent


def test_runs_started_in_the_same_second_get_their_own_directories(stub, tmp_path, monkeypatch):
    import time

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(time, "strftime", lambda *args: "20260101-120000")
    argv = ["agent", "run", "--base-url", stub.url, "--model", "m", "--quiet", "--no-stream"]
    for answer in ("one", "two"):
        stub.reply({"choices": [{"index": 0, "message": {"content": answer}, "finish_reason": "stop"}]})
        assert main([*argv, "--task", "hello"]) == 0
    runs = sorted((tmp_path / "runs" / "agent").iterdir())
    assert [r.name for r in runs] == ["20260101-120000", "20260101-120000-2"]
    assert [json.loads((r / "trajectory.json").read_text())["final"] for r in runs] == ["one", "two"]
