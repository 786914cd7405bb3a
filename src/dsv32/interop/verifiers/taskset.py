"""The dsv32 environments as a verifiers taskset (verifiers' v1 API: taskset, task, toolset, harness).

- :class:`DSV32Taskset` loads a dsv32 task set (``env``, ``split``: a registered set or a JSONL file)
  as verifiers tasks: each row's ``prompt`` is the task the environment's ``reset`` poses and its
  ``system_prompt`` the environment's; ``answer``, ``info`` and ``task`` (the environment's name) keep
  the dsv32 row's fields under the names verifiers' dataset columns use, and ``row`` the whole row.
- :class:`DSV32Task` declares the environment's tools as a per-rollout tool server
  (:class:`~dsv32.interop.verifiers.toolset.DSV32Toolset`: MCP, one sandboxed environment per rollout)
  and scores a trace with the dsv32 verifier (``@vf.reward dsv32``; its components are metrics).
- :class:`DSV32Harness` is the default harness: verifiers' own chat loop with the MCP tools (the
  ``null`` harness), so the model acts only through the environment's sandboxed tools.
- :func:`load_environment` builds the verifiers ``Env`` with verifiers' own ``load_environment``.

The reward replays the trace's assistant turns through a fresh environment of the same task
(:func:`dsv32.envs.replay`: every tool call runs again, sandboxed) and asks its verifier: verifiers
tears a rollout's tool servers down before it scores, and the verdict of a stateful environment (a
database, a repository) needs the state those calls made. A tool whose results are not reproducible
(time, randomness without a seed) can therefore be scored on a state the model did not see.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import verifiers.v1 as vf
from pydantic import Field
from verifiers.v1.harnesses.null import NullHarness
from verifiers.v1.utils.loaders import load_environment as vf_load_environment
from verifiers.v1.utils.loaders import resolve_env_config

from dsv32.envs.base import Environment, Reward, Task, get_env, replay, resolve_tasks
from dsv32.interop.errors import InteropError
from dsv32.interop.verifiers.messages import to_openai
from dsv32.interop.verifiers.toolset import DSV32Toolset, DSV32ToolsetConfig

TASKSET_ID = "dsv32-envs"
"""The verifiers id of this taskset: verifiers imports it as the module ``dsv32_envs``."""


class DSV32TaskConfig(vf.TaskConfig):
    """Where each rollout's tool server runs (``--env.taskset.task.tools.*``)."""

    tools: DSV32ToolsetConfig = DSV32ToolsetConfig()


class DSV32TasksetConfig(vf.TasksetConfig):
    """Which dsv32 tasks load (``--env.taskset.env``, ``--env.taskset.split``, ``--env.taskset.options``)."""

    env: str = "code-interpreter"
    """A registered dsv32 environment (``dsv32 envs list``)."""
    split: str | None = "train"
    """One of its task sets, or a JSONL file of tasks; None: its first set."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Keyword options of the environment (``cell_timeout_s``, ...)."""
    task: DSV32TaskConfig = DSV32TaskConfig()


class DSV32Data(vf.TaskData):
    """One dsv32 task as verifiers task data."""

    env: str
    options: dict[str, Any] = Field(default_factory=dict)
    row: dict[str, Any]
    """The dsv32 task row (``id``, ``prompt``, ``answer``, ``domain``, ``info``)."""
    answer: Any = None
    info: dict[str, Any] = Field(default_factory=dict)
    task: str = ""
    """The environment's name (verifiers' ``task`` column)."""


def make_env(data: DSV32Data) -> Environment:
    return get_env(data.env).factory(**data.options)


def score_messages(data: DSV32Data, messages: list[dict], final: str | None) -> Reward:
    """The dsv32 verdict on a conversation: its assistant turns replayed through a fresh environment
    of the task (tool calls run again), then the environment's verifier."""
    env = make_env(data)
    try:
        replies = [m for m in messages if m.get("role") == "assistant"]
        if final is not None and (not replies or replies[-1].get("tool_calls")):
            replies.append({"role": "assistant", "content": final})
        episode = replay(env, Task.from_dict(data.row), replies)
        return env.reward(episode)
    finally:
        env.close()


class DSV32Task(vf.Task[DSV32Data, vf.State, DSV32TaskConfig]):
    """A dsv32 task: its environment's tools (a per-rollout MCP server) and its verifier's reward."""

    @classmethod
    def toolsets(cls, config: DSV32TaskConfig) -> list[vf.Toolset]:
        return [DSV32Toolset(config.tools)]

    @property
    def key(self) -> str:
        return f"{self.data.env}/{self.data.row['id']}"

    @vf.reward(weight=1.0)
    async def dsv32(self, trace: vf.Trace) -> float:
        messages = to_openai(trace.messages)
        verdict = await asyncio.to_thread(score_messages, self.data, messages, trace.root_reply)
        trace.info["dsv32"] = {"reason": verdict.reason, "scored": verdict.scored}
        trace.record_metrics({f"dsv32_{k}": v for k, v in verdict.components.items()})
        if not verdict.scored:  # the environment failed: an error of the rollout, not a 0 for the model
            raise InteropError(f"the dsv32 verifier gave no verdict: {verdict.reason}")
        return float(verdict.value)


class DSV32Taskset(vf.Taskset[DSV32Task, DSV32TasksetConfig]):
    """The tasks of one dsv32 task set; each reset once at load for its system prompt and task."""

    def load(self) -> Iterator[DSV32Task]:
        config = self.config
        tasks = resolve_tasks(config.env, config.split)
        env = get_env(config.env).factory(**config.options)
        try:
            for task in tasks:
                messages = env.reset(task)
                system = "\n\n".join(m["content"] for m in messages if m.get("role") == "system") or None
                rest = [m for m in messages if m.get("role") != "system"]
                prompt = rest[0]["content"] if len(rest) == 1 and rest[0].get("role") == "user" else None
                if prompt is None:
                    raise InteropError(
                        f"{config.env} task {task.id!r}: reset gave {len(rest)} non-system messages"
                    )
                data = DSV32Data(
                    id=task.id, name=f"{config.env}/{task.id}", prompt=prompt, system_prompt=system,
                    env=config.env, options=dict(config.options), row=task.to_dict(), answer=task.answer,
                    info=dict(task.info), task=config.env,
                )  # fmt: skip
                yield DSV32Task(data, config.task)
        finally:
            env.close()


class DSV32Harness(NullHarness):
    """verifiers' chat loop with the rollout's MCP tools and nothing else (no shell on the host):
    the model acts only through the environment's sandboxed tools."""


def load_environment(env: str = "code-interpreter", split: str | None = "train", **kwargs: Any) -> vf.Env:
    """The dsv32 environment ``env`` on its task set ``split`` as a verifiers ``Env`` (a
    ``SingleAgentEnv`` whose agent plays :class:`DSV32Harness`). ``kwargs``: ``options`` (the
    environment's keywords), ``task`` (``{"tools": {...}}``, where the tool servers run), and any
    other field of verifiers' taskset config."""
    config = resolve_env_config({"taskset": {"id": TASKSET_ID, "env": env, "split": split, **kwargs}})
    return vf_load_environment(config)
