"""run_episode: an environment's tools become agent tools, the agent runs, the verifier scores."""

from __future__ import annotations

import json

from agent_helpers import CountingBackend, answer

from dsv32.agent import ScriptedBackend, Trajectory, run_episode
from dsv32.envs.base import Environment, Reward, Task, tool_call, tool_schema


class Counter(Environment):
    """A counter the agent increments; the task is solved when the answer states the final count."""

    name = "counter"

    def __init__(self) -> None:
        self.count, self.calls, self.resets = 0, [], 0

    def reset(self, task: Task) -> list[dict]:
        self.count, self.resets = 0, self.resets + 1
        return [{"role": "system", "content": "Use the counter."}, {"role": "user", "content": task.prompt}]

    def tools(self) -> list[dict]:
        return [tool_schema("increment", "Add n to the counter.", {"n": {"type": "integer", "minimum": 1}})]

    def call(self, name: str, arguments: dict) -> str:
        self.calls.append((name, arguments))
        self.count += arguments["n"]
        return f"count = {self.count}"

    def reward(self, trajectory) -> Reward:
        ok = trajectory.final is not None and trajectory.final.strip() == str(self.count) == str(
            self.task_answer
        )
        tools_seen = sum(m["role"] == "tool" for m in trajectory.messages)
        return Reward(float(ok), {"tool_results": tools_seen}, "right count" if ok else "wrong count")

    def reference(self, task: Task) -> list[dict]:
        return [
            {
                "content": "",
                "tool_calls": [
                    tool_call("increment", {"n": 2}, "r1"),
                    tool_call("increment", {"n": 1}, "r2"),
                ],
            },
            {"content": str(task.answer)},
        ]

    task_answer = 3


TASK = Task("t1", "Count to 3.", answer=3)


def test_the_reference_solution_scores_one_through_the_env_tools():
    env = Counter()
    traj, reward = run_episode(ScriptedBackend(env.reference(TASK)), env, TASK, thinking=False)
    assert isinstance(traj, Trajectory) and traj.stop_reason == "answer"
    assert reward.value == 1.0 and reward.components == {"tool_results": 2}
    assert env.calls == [("increment", {"n": 2}), ("increment", {"n": 1})]
    assert traj.messages[0] == {"role": "system", "content": "Use the counter."}
    assert [m["tool_call_id"] for m in traj.messages if m["role"] == "tool"] == ["r1", "r2"]


def test_bad_calls_never_reach_the_environment():
    env = Counter()
    script = [
        {
            "content": "",
            "tool_calls": [tool_call("increment", {"n": 0}, "a"), tool_call("increment", {"k": 1}, "b")],
        },
        {"content": "", "tool_calls": [tool_call("decrement", {"n": 1}, "c")]},
        {"content": "0"},
    ]
    traj, reward = run_episode(ScriptedBackend(script), env, TASK, thinking=False)
    assert env.calls == []
    results = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert "n: must be >= 1, got 0" in results[0]
    assert "n: required field missing" in results[1] and "k: unknown field" not in results[1]
    assert results[2].startswith("Error: unknown tool 'decrement'")
    assert reward.value == 0.0


def test_parallel_fewest_step_resets_the_env_per_thread_and_returns_the_winner_reward():
    env = Counter()
    slow = [{"content": "", "tool_calls": [tool_call("increment", {"n": 1}, f"s{i}")]} for i in range(3)] + [
        answer("3")
    ]
    fast = [{"content": "", "tool_calls": [tool_call("increment", {"n": 3}, "f")]}, answer("3")]
    wrong = [answer("7")]
    backend = CountingBackend(slow + fast + wrong, per_message=1)
    traj, reward = run_episode(
        backend, env, TASK, context="parallel_fewest_step", parallel=3, context_window=10_000
    )
    assert env.resets == 3
    assert [t.steps for t in traj.threads] == [4, 2, 1]
    # the fewest steps among finished threads wins: the wrong one-step answer (the baseline does not verify)
    assert traj.final == "7" and reward.value == 0.0
    assert traj.total_steps == 7
    assert json.dumps(traj.to_dict())  # the whole record is JSON
