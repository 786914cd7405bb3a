"""Agents that think with tools (paper §3.2, §4.4): the loop, its backends, tools and test-time
context management.

    from dsv32.agent import Agent, OpenAIBackend, LocalBackend, ScriptedBackend, Trajectory, tool

    agent = Agent(OpenAIBackend("http://localhost:8000/v1", "deepseek-v3.2"), [my_function],
                  context_window=128_000, context="discard_all")
    trajectory = agent.run("What is ...?")
    trajectory.final, trajectory.stop_reason, trajectory.steps

:func:`run_episode` runs one task of a :mod:`dsv32.envs` environment and scores it. See docs/agent.md.
"""

from dsv32.agent.backends import Backend, Completion, LocalBackend, OpenAIBackend, ScriptedBackend, Usage
from dsv32.agent.context import STRATEGIES
from dsv32.agent.episode import env_tools, run_episode
from dsv32.agent.errors import AgentError, BackendError, ContextLengthError
from dsv32.agent.loop import Agent
from dsv32.agent.tools import Tool, Toolbox, ToolOutput, tool
from dsv32.agent.trajectory import ContextEvent, Step, ThreadSummary, ToolRecord, Trajectory

__all__ = [
    "STRATEGIES",
    "Agent",
    "AgentError",
    "Backend",
    "BackendError",
    "Completion",
    "ContextEvent",
    "ContextLengthError",
    "LocalBackend",
    "OpenAIBackend",
    "ScriptedBackend",
    "Step",
    "ThreadSummary",
    "Tool",
    "ToolOutput",
    "ToolRecord",
    "Toolbox",
    "Trajectory",
    "Usage",
    "env_tools",
    "run_episode",
    "tool",
]
