"""Trajectory files: whatever the episode held, ``save`` and ``write_jsonl`` write it whole or leave
the previous file, and ``load`` gives back what was saved."""

from __future__ import annotations

import json

import pytest
from helpers.agent import answer, calls

from dsv32.agent import Agent, ScriptedBackend, Trajectory, tool
from dsv32.agent.trajectory import Step


def test_a_lone_surrogate_in_a_tool_result_is_saved_and_read_back(tmp_path):
    name = b"caf\xe9.txt".decode("utf-8", "surrogateescape")  # what os.listdir gives for Latin-1 bytes
    ls = tool(lambda: name, name="ls", schema={"type": "object"})
    traj = Agent(ScriptedBackend([calls(("ls", {})), answer(f"found {name}")]), [ls]).run("list")
    assert traj.messages[-2]["content"] == name
    again = Trajectory.load(traj.save(tmp_path / "trajectory.json"))
    assert again == traj and again.final == f"found {name}"
    lines = traj.write_jsonl(tmp_path / "steps.jsonl").read_text(encoding="utf-8").splitlines()
    assert json.loads(lines[-1])["episode"]["final"] == f"found {name}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["steps.jsonl", "trajectory.json"]


def test_a_write_that_fails_leaves_the_previous_file(tmp_path):
    traj = Agent(ScriptedBackend([answer("ok")]), []).run("q")
    path = traj.write_jsonl(tmp_path / "steps.jsonl")
    before = path.read_text()
    traj.steps[0].problems.append({"position": object()})  # cannot be written as JSON
    traj.steps.insert(0, Step(index=0))  # written before the one that fails
    with pytest.raises(TypeError):
        traj.write_jsonl(path)
    with pytest.raises(TypeError):
        traj.save(tmp_path / "steps.jsonl")
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["steps.jsonl"]  # no temporary file left behind
