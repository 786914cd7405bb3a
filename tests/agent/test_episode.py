"""run_episode: an environment's tools become agent tools, the agent runs, the verifier scores."""

from __future__ import annotations

import json

from helpers.agent import Counter, CountingBackend, answer

from dsv32.agent import ScriptedBackend, Trajectory, run_episode
from dsv32.envs.base import Reward, Task, tool_call

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


class Fragile(Counter):
    """A counter whose methods fail as told: ``fail={"reset", "tools", "call", "reward", "reward_none"}``."""

    name = "fragile"

    def __init__(self, *fail: str) -> None:
        super().__init__()
        self.fail = set(fail)

    def reset(self, task: Task) -> list[dict]:
        if "reset" in self.fail:
            raise OSError("the task's files are gone")
        return super().reset(task)

    def tools(self) -> list[dict]:
        if "tools" in self.fail:
            raise RuntimeError("no schemas")
        return super().tools()

    def call(self, name: str, arguments: dict) -> str:
        if "call" in self.fail:
            raise ValueError("counter jammed")
        return super().call(name, arguments)

    def reward(self, trajectory) -> Reward:
        if "reward" in self.fail:
            # a verifier tripping over what the model left behind
            return {"count": self.count}["missing"]
        if "reward_none" in self.fail:
            return None
        return super().reward(trajectory)


def test_a_reward_that_raises_ends_the_episode_with_error_and_keeps_the_trajectory():
    env = Fragile("reward")
    traj, reward = run_episode(ScriptedBackend(env.reference(TASK)), env, TASK, thinking=False)
    assert traj.stop_reason == "error"
    assert traj.error == (
        "the environment's reward raised KeyError: 'missing' (the agent had stopped with 'answer')"
    )
    assert traj.final == "3" and traj.num_steps == 2  # everything the agent did is kept
    assert [m["role"] for m in traj.messages] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert reward == Reward(0.0, {}, f"not scored: {traj.error}", scored=False)
    assert json.loads(json.dumps(traj.to_dict()))["error"] == traj.error


def test_a_reward_that_returns_no_reward_and_a_backend_failure_are_both_recorded():
    env = Fragile("reward_none")
    traj, reward = run_episode(ScriptedBackend(env.reference(TASK)[:1]), env, TASK, thinking=False)
    assert traj.stop_reason == "error" and traj.num_steps == 1
    assert traj.error.startswith("the script has no reply 2")
    assert traj.error.endswith("; then the environment's reward returned None, not a Reward")
    assert reward.value == 0.0 and reward.reason.startswith("not scored: the environment's reward")


def test_a_reset_or_tools_failure_is_an_error_episode_without_model_calls():
    for fail, text in (
        ("reset", "OSError: the task's files are gone"),
        ("tools", "RuntimeError: no schemas"),
    ):
        env = Fragile(fail)
        backend = ScriptedBackend([answer("3")])
        traj, reward = run_episode(backend, env, TASK)
        assert traj.stop_reason == "error" and traj.error == f"the environment's reset/tools raised {text}"
        assert traj.num_steps == 0 and backend.calls == [] and reward.value == 0.0
    assert [m["role"] for m in traj.messages] == ["system", "user"]  # tools failed after the reset


def test_a_failing_call_is_answered_to_the_model():
    env = Fragile("call")
    traj, reward = run_episode(ScriptedBackend(env.reference(TASK)), env, TASK, thinking=False)
    assert traj.stop_reason == "answer" and reward.value == 0.0  # scored: the count stayed 0
    results = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert results == ["Error: increment raised ValueError: counter jammed"] * 2


class SecondVerdictCrashes(Counter):
    def reward(self, trajectory) -> Reward:
        self.verdicts = getattr(self, "verdicts", 0) + 1
        if self.verdicts == 2:
            raise RuntimeError("verifier crashed")
        return super().reward(trajectory)


def test_parallel_threads_survive_a_reward_failure_in_one_of_them():
    env = SecondVerdictCrashes()
    script = env.reference(TASK) * 2
    traj, reward = run_episode(
        ScriptedBackend(script), env, TASK, context="parallel_fewest_step", parallel=2, thinking=False
    )
    assert [t.stop_reason for t in traj.threads] == ["answer", "error"]
    assert traj.stop_reason == "answer" and reward.value == 1.0 and traj.total_steps == 4


class Slow(Counter):
    """A counter whose calls take 0.3 s and which says they never take longer than 5 s."""

    def __init__(self, bound=5.0) -> None:
        super().__init__()
        self.bound = bound

    def call(self, name: str, arguments: dict) -> str:
        import time

        time.sleep(0.3)
        return super().call(name, arguments)

    def call_bound_s(self, name: str):
        return self.bound


def test_an_environment_s_own_call_bound_replaces_the_agent_s_tool_timeout():
    traj, reward = run_episode(ScriptedBackend(Slow().reference(TASK)), Slow(), TASK, tool_timeout_s=0.1)
    assert [m["content"] for m in traj.messages if m["role"] == "tool"] == ["count = 2", "count = 3"]
    assert reward.value == 1.0
    # without a bound the agent's own 0.1 s apply: both calls are abandoned
    traj, _ = run_episode(ScriptedBackend(Slow().reference(TASK)), Slow(None), TASK, tool_timeout_s=0.1)
    assert all("timed out" in m["content"] for m in traj.messages if m["role"] == "tool")
    for bad in (
        "5",
        -1.0,
        0,
        float("nan"),
        True,
    ):  # not a positive number of seconds: the environment's fault
        traj, reward = run_episode(ScriptedBackend([answer("3")]), Slow(bad), TASK)
        assert traj.stop_reason == "error" and "call_bound_s('increment') must be a positive" in traj.error
        assert not reward.scored
