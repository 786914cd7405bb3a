"""dsv32's OpenEnv adapter inside dsv32's agent loop, against a tiny arithmetic environment written
here with openenv-core's own base classes and server helper: the reference reply scores 1, a wrong
one 0 — through a tool call that ends the episode, and through the final answer."""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("openenv", reason="openenv-core is not installed (pip install 'dsv32[openenv]')")

from openenv.core.env_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

from dsv32.agent import ScriptedBackend, run_episode
from dsv32.envs import get_env, resolve_tasks, tool_call
from dsv32.envs.base import _REGISTRY
from dsv32.interop.errors import InteropError
from dsv32.interop.openenv import OpenEnvEnvironment, ServerThread, build_app, openenv_tasks, register_openenv


class SumAction(Action):
    """Answer the question with a number."""

    answer: str


class SumObservation(Observation):
    question: str = ""
    feedback: str = ""


class SumEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state, self.total = State(), None

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> SumObservation:
        a, b = question(seed)
        self.total, self._state = a + b, State(episode_id=episode_id)
        return SumObservation(question=f"What is {a} + {b}?")

    def step(self, action: SumAction, timeout_s: float | None = None, **kwargs: Any) -> SumObservation:
        self._state.step_count += 1
        correct = action.answer.strip() == str(self.total)
        return SumObservation(feedback="correct" if correct else "wrong", done=True, reward=float(correct))

    @property
    def state(self) -> State:
        return self._state


def question(seed: int | None) -> tuple[int, int]:
    rng = random.Random(seed)
    return rng.randint(100, 999), rng.randint(100, 999)


@pytest.fixture(scope="module")
def server():
    app = create_fastapi_app(SumEnvironment, SumAction, SumObservation, max_concurrent_envs=2)
    with ServerThread(app) as s:  # 127.0.0.1, a free port
        yield s


def total(seed: int) -> str:
    return str(sum(question(seed)))


def test_a_tool_call_that_ends_the_episode(server):
    task = openenv_tasks([{"seed": 3}])[0]
    for answer, expected in ((total(3), 1.0), ("0", 0.0)):
        env = OpenEnvEnvironment(server.url)
        replies = [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [tool_call("sum_action", {"answer": answer}, "c1")],
            },
            {"role": "assistant", "content": f"The sum is {answer}."},
        ]
        try:
            trajectory, reward = run_episode(ScriptedBackend(replies), env, task)
        finally:
            env.close()
        assert env.protocol == "action"
        assert trajectory.stop_reason == "answer"
        assert "What is" in trajectory.messages[1]["content"]
        result = trajectory.messages[3]["content"]
        assert ("correct" if expected else "wrong") in result and "ended the episode" in result
        assert (reward.value, reward.scored, reward.components) == (expected, True, {"openenv": expected})


def test_the_final_answer_as_the_action(server):
    task = openenv_tasks([{"seed": 8}])[0]
    for answer, expected in ((total(8), 1.0), ("12", 0.0)):
        env = OpenEnvEnvironment(server.url, answer_field="answer")
        try:
            trajectory, reward = run_episode(
                ScriptedBackend([{"role": "assistant", "content": answer}]), env, task
            )
            assert [t["function"]["name"] for t in env.tools()] == ["sum_action"]
            assert env.tools()[0]["function"]["parameters"]["required"] == ["answer"]
        finally:
            env.close()
        assert (reward.value, reward.scored) == (expected, True)


def test_no_done_scores_0_and_a_dead_server_is_not_the_models_fault(server):
    env = OpenEnvEnvironment(server.url)  # no answer_field: a final answer alone does not end the episode
    try:
        _, reward = run_episode(
            ScriptedBackend([{"role": "assistant", "content": "42"}]), env, openenv_tasks(1)[0]
        )
    finally:
        env.close()
    assert reward.value == 0.0 and reward.scored and "did not end" in reward.reason
    with pytest.raises(InteropError, match="schema"):
        OpenEnvEnvironment("http://127.0.0.1:9").reset(openenv_tasks(1)[0])


def test_a_served_dsv32_environment_through_the_adapter():
    """Both halves together: the code interpreter served over OpenEnv, played by the agent loop."""
    with ServerThread(build_app("code-interpreter", tasks="smoke", max_sessions=1)) as s:
        spec = register_openenv("served-interpreter", s.url, openenv_tasks([{"index": 0}]))
        native = get_env("code-interpreter").factory()
        task = openenv_tasks([{"index": 0}])[0]
        replies = native.reference(resolve_tasks("code-interpreter", "smoke")[0])
        env = get_env("served-interpreter").factory()
        try:
            trajectory, reward = run_episode(ScriptedBackend(replies), env, task)
        finally:
            env.close()
            native.close()
            _REGISTRY.pop("served-interpreter", None)  # the registry is the process's: leave it as it was
        assert spec.name == "served-interpreter" and env.protocol == "dsv32"
        assert trajectory.messages[0]["content"].startswith("You can run Python")
        assert reward.value == 1.0 and reward.components["correct"] == 1.0
