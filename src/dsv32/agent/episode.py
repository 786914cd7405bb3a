"""One scored episode in an environment: reset, run the agent on the environment's tools, verify.

``run_episode(backend, env, task, **agent_options) -> (Trajectory, Reward)``:

1. ``messages = env.reset(task)`` (the system prompt and the task); with ``prompt`` the system
   message is that prompt's (:func:`episode_messages`);
2. the environment's schemas (``env.tools()``) become agent tools whose calls go to
   ``env.call(name, arguments)``, after the same validation as any tool (a bad call never reaches
   the environment; the model reads the error);
3. the agent runs (``agent_options`` are :class:`~dsv32.agent.loop.Agent`'s keywords);
4. ``env.reward(trajectory)`` scores it.

With ``context="parallel_fewest_step"`` each of the ``parallel`` trajectories is its own episode
(reset, run, reward), since the environment's state belongs to one trajectory; the winner's reward is
returned and the totals count every thread. The caller owns ``env`` (this does not close it).
"""

from __future__ import annotations

from typing import Any

from dsv32.agent.backends.base import Backend
from dsv32.agent.loop import Agent, combine_threads
from dsv32.agent.tools import Tool, tool
from dsv32.agent.trajectory import Trajectory
from dsv32.chat.templates import episode_system_message
from dsv32.envs.base import Environment, Reward, Task


def env_tools(env: Environment) -> list[Tool]:
    """The environment's OpenAI schemas as tools that call ``env.call``."""
    tools = []
    for schema in env.tools():
        name = (schema.get("function") or schema).get("name")

        def call(_name: str = name, **arguments: Any) -> str:
            return env.call(_name, arguments)

        tools.append(tool(call, schema=schema))
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
    messages = episode_messages(env, task, prompt)
    agent = Agent(backend, env_tools(env), **agent_options)
    trajectory = agent.run(messages)
    return trajectory, env.reward(trajectory)
