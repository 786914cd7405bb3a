"""A verifiers taskset inside dsv32's agent loop: a tiny taskset written here with verifiers' own base
classes (its rubric: an exact-answer reward), and the dsv32-envs taskset with its real tool servers
launched by verifiers: the reference reply scores 1, a wrong one 0 (test_verifiers_taskset.py scores
a wrong dsv32-envs answer without the tool servers)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("verifiers.v1", reason="verifiers is not installed (pip install 'dsv32[verifiers]')")

import verifiers.v1 as vf

from dsv32.agent import ScriptedBackend, run_episode
from dsv32.envs import Task, get_env
from dsv32.envs.base import _REGISTRY
from dsv32.interop.errors import InteropError
from dsv32.interop.verifiers import VerifiersEnvironment, register_verifiers


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData]):
    @vf.reward(weight=1.0)
    async def exact(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == self.data.answer)

    @vf.metric
    async def turns(self, trace: vf.Trace) -> float:
        return float(trace.num_turns)


class SumTaskset(vf.Taskset[SumTask, vf.TasksetConfig]):
    def load(self) -> Iterator[SumTask]:
        for a, b in ((2, 3), (40, 2)):
            yield SumTask(SumData(id=f"{a}+{b}", prompt=f"What is {a} + {b}?", answer=str(a + b),
                                  system_prompt="Answer with the number."), self.config.task)  # fmt: skip


def test_a_verifiers_rubric_scores_dsv32_episodes():
    env = VerifiersEnvironment(SumTaskset(vf.TasksetConfig(id="sums")))
    try:
        tasks = env.tasks()
        assert [(t.id, t.prompt, t.answer) for t in tasks] == [
            ("2+3", "What is 2 + 3?", "5"),
            ("40+2", "What is 40 + 2?", "42"),
        ]
        for reply, expected in (("42", 1.0), ("41", 0.0)):
            trajectory, reward = run_episode(
                ScriptedBackend([{"role": "assistant", "content": reply}]), env, tasks[1]
            )
            assert trajectory.messages[0] == {"role": "system", "content": "Answer with the number."}
            assert (reward.value, reward.scored, reward.components) == (expected, True, {"exact": expected})
            assert env.trace.metrics == {"turns": 1.0}
        assert env.tools() == []
    finally:
        env.close()
    spec = register_verifiers("sums-test", SumTaskset(vf.TasksetConfig(id="sums")))
    try:  # by name, as agentic GRPO builds its environments
        named = get_env("sums-test")
        env = named.factory()
        task = named.task_sets["default"]()[0]
        messages = env.reset(task)
        assert messages == [
            {"role": "system", "content": "Answer with the number."},
            {"role": "user", "content": "What is 2 + 3?"},
        ]
    finally:
        env.close()
        _REGISTRY.pop("sums-test", None)  # the registry is the process's: leave it as it was
    assert spec.name == "sums-test"
    with pytest.raises(InteropError, match="config applies"):
        VerifiersEnvironment(SumTaskset(vf.TasksetConfig(id="sums")), {"x": 1})
    with pytest.raises(InteropError, match="no-such-taskset"):
        VerifiersEnvironment("no-such-taskset")


def test_dsv32_envs_round_trip_with_verifiers_tool_servers():
    """verifiers launches the dsv32 tool server for the episode; dsv32's agent loop plays it."""
    env = VerifiersEnvironment("dsv32-envs", {"env": "code-interpreter", "split": "smoke"})
    native = get_env("code-interpreter").factory()
    try:
        task = env.tasks()[0]
        replies = native.reference(Task.from_dict(task.info["verifiers"]["row"]))
        trajectory, reward = run_episode(ScriptedBackend(replies), env, task)
        assert trajectory.stop_reason == "answer" and trajectory.messages[0]["content"].startswith(
            "You can run"
        )
        tool_results = [m["content"] for m in trajectory.messages if m["role"] == "tool"]
        assert tool_results == [task.answer]  # the cell ran in the tool server's sandboxed kernel
        assert (reward.value, reward.components) == (1.0, {"dsv32": 1.0})
        assert env.trace.metrics["dsv32_correct"] == 1.0

    finally:
        env.close()
        native.close()
