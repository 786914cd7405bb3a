"""One scored episode in an environment: reset, run the agent on the environment's tools, verify.

``run_episode(backend, env, task, **agent_options) -> (Trajectory, Reward)``:

1. ``messages = env.reset(task)`` (the system prompt and the task); with ``prompt`` the system
   message is that prompt's (:func:`episode_messages`);
2. the environment's schemas (``env.tools()``) become agent tools whose calls go to
   ``env.call(name, arguments)``, after the same validation as any tool (a bad call never reaches
   the environment; the model reads the error), each waited on for the environment's own bound
   (``env.call_bound_s(name)``) where it declares one, else for the agent's tool timeout;
3. the agent runs (``agent_options`` are :class:`~dsv32.agent.loop.Agent`'s keywords);
4. ``env.reward(trajectory)`` scores it.

A failing environment never loses an episode. ``env.call`` raising is a tool that raised: the model
reads the error and goes on. ``env.reset`` / ``env.tools`` raising (before any model call: the
trajectory holds no step) or ``env.reward`` raising or returning something other than a
:class:`~dsv32.envs.base.Reward` ends the episode with ``stop_reason="error"``: ``trajectory.error``
names the method and the exception, and the agent's own stop reason when it had run (``"the
environment's reward raised KeyError: 'x' (the agent had stopped with 'answer')"``); the trajectory
keeps everything the agent did, and the reward is ``Reward(0.0, {}, "not scored: ...")`` — the
environment failed, the model was not judged. Bad ``agent_options`` still raise
:class:`~dsv32.agent.errors.AgentError`.

With ``context="parallel_fewest_step"`` each of the ``parallel`` trajectories is its own episode
(reset, run, reward), since the environment's state belongs to one trajectory; the winner's reward is
returned and the totals count every thread. The caller owns ``env`` (this does not close it).
"""

from __future__ import annotations

import math
from typing import Any

from dsv32.agent.backends.base import Backend
from dsv32.agent.loop import Agent, combine_threads
from dsv32.agent.tools import Tool, shown, tool
from dsv32.agent.trajectory import Trajectory
from dsv32.chat.templates import episode_system_message
from dsv32.envs.base import EnvError, Environment, Reward, Task


def env_tools(env: Environment) -> list[Tool]:
    """The environment's OpenAI schemas as tools that call ``env.call``."""
    tools = []
    for schema in env.tools():
        name = (schema.get("function") or schema).get("name")

        def call(_name: str = name, **arguments: Any) -> str:
            return env.call(_name, arguments)

        bound = env.call_bound_s(name)
        if bound is not None and not (
            isinstance(bound, (int, float)) and not isinstance(bound, bool) and 0 < bound < math.inf
        ):
            raise EnvError(
                f"call_bound_s({name!r}) must be a positive number of seconds or None, got {bound!r}"
            )
        tools.append(tool(call, schema=schema, timeout_s=bound))
    return tools


def episode_messages(env: Environment, task: Task, prompt: str | None = None) -> list[dict]:
    """``env.reset(task)``, its system message as ``prompt`` asks
    (:data:`dsv32.chat.templates.EPISODE_PROMPTS`): ``env``/``bare`` keep the environment's own,
    ``reasoning_agent``/``agent`` use Appendix B's Table 8 / Table 7; ``None`` leaves it as it is."""
    messages = env.reset(task)
    if prompt is not None:
        messages[0] = episode_system_message(prompt, messages[0]["content"], env.tools())
    return messages


def run_episode(
    backend: Backend, env: Environment, task: Task, *, prompt: str | None = None, **agent_options: Any
) -> tuple[Trajectory, Reward]:
    context = agent_options.pop("context", "none")
    parallel = agent_options.pop("parallel", 4)
    if context != "parallel_fewest_step":
        return _scored(backend, env, task, prompt, context=context, **agent_options)
    runs = [_scored(backend, env, task, prompt, context="none", **agent_options) for _ in range(parallel)]
    winner = combine_threads([traj for traj, _ in runs])
    reward = next(r for traj, r in runs if traj is winner)
    return winner, reward


def _scored(
    backend: Backend, env: Environment, task: Task, prompt: str | None, **agent_options: Any
) -> tuple[Trajectory, Reward]:
    messages: list[dict] = []
    try:
        messages = episode_messages(env, task, prompt)
        tools = env_tools(env)
    except (Exception, SystemExit) as err:  # the environment's failure: recorded, not raised
        failed = Trajectory(messages=list(messages))
        return failed, _not_scored(failed, "reset/tools", err)
    agent = Agent(backend, tools, **agent_options)
    trajectory = agent.run(messages)
    try:
        reward = env.reward(trajectory)
    except (Exception, SystemExit) as err:
        return trajectory, _not_scored(trajectory, "reward", err)
    if not isinstance(reward, Reward):
        got = "None" if reward is None else f"a {type(reward).__name__}"
        return trajectory, _not_scored(trajectory, "reward", f"returned {got}, not a Reward")
    return trajectory, reward


def _not_scored(trajectory: Trajectory, method: str, problem: BaseException | str) -> Reward:
    """Record on ``trajectory`` that the environment's ``method`` failed; the reward that says so."""
    if isinstance(problem, BaseException):
        problem = f"raised {type(problem).__name__}: {shown(problem)}"
    note = f"the environment's {method} {problem}"
    if trajectory.stop_reason == "error" and trajectory.error:
        trajectory.error = f"{trajectory.error}; then {note}"
    else:
        if trajectory.steps:
            note += f" (the agent had stopped with {trajectory.stop_reason!r})"
        trajectory.stop_reason, trajectory.error = "error", note
    return Reward(0.0, {}, f"not scored: {note}", scored=False)
