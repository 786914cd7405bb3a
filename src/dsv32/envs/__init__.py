"""Verifiable environments for agents (paper §3.2.3) and the sandbox that runs model-written code.

See :mod:`dsv32.envs.base` for the interface (``reset`` / ``tools`` / ``call`` / ``reward`` /
``reference`` / ``state`` / ``close``), tasks as JSONL rows, and the registry behind
``dsv32 envs list|show|run``.
"""

from dsv32.envs.base import (
    EnvError,
    Environment,
    EnvSpec,
    Episode,
    Reward,
    Task,
    get_env,
    load_tasks,
    register,
    registry,
    replay,
    resolve_tasks,
    save_tasks,
    tool_call,
    tool_schema,
)

__all__ = [
    "EnvError",
    "EnvSpec",
    "Environment",
    "Episode",
    "Reward",
    "Task",
    "get_env",
    "load_tasks",
    "register",
    "registry",
    "replay",
    "resolve_tasks",
    "save_tasks",
    "tool_call",
    "tool_schema",
]
