"""A verifiers taskset as a dsv32 environment: its rows as tasks, its tools, its rewards.

``VerifiersEnvironment(taskset)`` (a verifiers taskset id, e.g. ``"dsv32-envs"`` or an installed
taskset package, or a ``Taskset`` object) plays one verifiers task per episode with verifiers' own
machinery, as one rollout would:

- ``tasks()``: the taskset's rows as dsv32 tasks (``info["verifiers"]`` holds the task data);
- ``reset``: a subprocess runtime, the task's ``setup`` hook, then its tool servers (``Task.toolsets``
  and the taskset's) launched with verifiers' ``serve`` and reached over MCP with verifiers' client;
  the servers fetch the task and share ``trace.state`` through a channel this environment serves on
  127.0.0.1 (what verifiers' interception serves in a rollout);
- ``tools`` / ``call``: the servers' tools and calls (a failing call is an ``error:`` text);
- ``reset`` returns the task's system prompt (or :data:`SYSTEM_PROMPT`) and its prompt;
- ``reward``: the tool servers go down, then the task's ``finalize`` and ``score`` run on a verifiers
  trace holding the episode's conversation; the reward is the trace's weighted reward sum, each
  reward function a component. A scoring failure raises (the episode is not scored).

The model, its sampling and the chat loop are dsv32's; verifiers' harness and interception are not
used. :attr:`trace` keeps the last episode's verifiers trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import secrets
import threading
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import verifiers.v1 as vf
from pydantic import TypeAdapter, ValidationError
from verifiers.v1.harnesses.utils.mcp import call_mcp, connect_mcp
from verifiers.v1.mcp import serve
from verifiers.v1.runtimes import SubprocessConfig, provision_runtime
from verifiers.v1.utils.decorators import invoke
from verifiers.v1.utils.loaders import load_taskset, taskset_config_type

from dsv32.envs.base import EnvError, Environment, EnvSpec, Reward, Task, TrajectoryLike, register
from dsv32.interop.errors import InteropError
from dsv32.interop.verifiers.messages import fill_trace, new_trace, to_openai

SYSTEM_PROMPT = "Solve the task. Use the tools when they help, then give your final answer."
"""The system message of a task that brings none (a dsv32 episode starts with one)."""


def open_taskset(taskset: str | vf.Taskset, config: dict | None = None) -> vf.Taskset:
    """A verifiers taskset from its id (and the fields of its config) or as given."""
    if isinstance(taskset, vf.Taskset):
        if config:
            raise InteropError("config applies to a taskset id; a Taskset object carries its own config")
        return taskset
    try:
        return load_taskset(taskset_config_type(taskset).model_validate({**(config or {}), "id": taskset}))
    except (ImportError, TypeError, ValueError) as err:
        raise InteropError(f"verifiers taskset {taskset!r}: {err}") from err


class _Loop:
    """An event loop on a thread of its own: verifiers is async, a dsv32 environment is not."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="verifiers-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine, timeout_s: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        if not self.thread.is_alive():
            self.loop.close()


@contextlib.asynccontextmanager
async def task_channel(trace: vf.Trace, secret: str) -> AsyncIterator[str]:
    """The rollout channel tool servers reach (``GET /task``, ``GET``/``PUT /state``), on 127.0.0.1."""
    from aiohttp import web

    state = TypeAdapter(type(trace.state))

    def allowed(request: web.Request) -> bool:
        return secrets.compare_digest(request.headers.get("Authorization", ""), f"Bearer {secret}")

    async def get_task(request: web.Request) -> web.Response:
        if not allowed(request):
            return web.json_response({"error": "unauthorized"}, status=401)
        data = trace.task.data
        return web.json_response(
            {"cls": f"{type(data).__module__}:{type(data).__qualname__}", "task": data.model_dump_json()}
        )

    async def get_state(request: web.Request) -> web.Response:
        if not allowed(request):
            return web.json_response({"error": "unauthorized"}, status=401)
        return web.Response(body=state.dump_json(trace.state), content_type="application/json")

    async def put_state(request: web.Request) -> web.Response:
        if not allowed(request):
            return web.json_response({"error": "unauthorized"}, status=401)
        try:
            trace.state = state.validate_json(await request.read())
        except ValidationError as err:
            return web.json_response({"error": str(err)}, status=400)
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_get("/task", get_task)
    app.router.add_get("/state", get_state)
    app.router.add_put("/state", put_state)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


class _Episode:
    """One verifiers task in play: its runtime, trace, tool servers and MCP clients."""

    def __init__(self, task: vf.Task, toolsets: list[vf.Toolset]) -> None:
        self.task, self.toolsets = task, toolsets
        self.trace = new_trace(task)
        self.stack = contextlib.AsyncExitStack()  # the runtime, the channel, the tool servers
        self.clients = contextlib.AsyncExitStack()  # the MCP connections
        self.runtime = None
        self.schemas: list[dict] = []
        self.dispatch: dict = {}
        self.servers: dict = {}

    async def open(self) -> None:
        self.runtime = await self.stack.enter_async_context(provision_runtime(SubprocessConfig()))
        await invoke(self.task.setup, {"trace": self.trace, "runtime": self.runtime})
        if not self.toolsets:
            return
        secret = secrets.token_urlsafe(24)
        base = await self.stack.enter_async_context(task_channel(self.trace, secret))
        urls = {}
        for toolset in self.toolsets:
            urls[toolset.server_name] = await self.stack.enter_async_context(
                serve(toolset, self.runtime, state_secret=secret, state_base=base)
            )
        config = {"mcpServers": {name: {"url": url} for name, url in urls.items()}}
        self.schemas, self.dispatch, self.servers = await connect_mcp(config, self.clients)

    async def call(self, name: str, arguments: dict) -> str:
        content = await call_mcp(self.servers, self.dispatch, name, arguments)
        if isinstance(content, str):
            return content
        texts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return "\n".join(texts) if texts else json.dumps(content, ensure_ascii=False)

    async def score(self, messages: list[dict], final: str | None) -> vf.Trace:
        await self.clients.aclose()  # tool servers go down before scoring, as in a verifiers rollout
        fill_trace(self.trace, messages, final)
        await invoke(self.task.finalize, {"trace": self.trace, "runtime": self.runtime})
        await self.task.score(self.trace, self.runtime)
        return self.trace

    async def close(self) -> None:
        await self.clients.aclose()
        await self.stack.aclose()


class VerifiersEnvironment(Environment):
    """The tasks of a verifiers taskset, one per episode (see the module docstring)."""

    name = "verifiers"
    description = "a verifiers taskset: its tasks, tool servers and rewards"

    def __init__(
        self, taskset: str | vf.Taskset, config: dict | None = None, *, start_timeout_s: float = 300,
        call_timeout_s: float = 600,
    ) -> None:  # fmt: skip
        self.taskset = open_taskset(taskset, config)
        self.task_cls = type(self.taskset).task_type()
        self.start_timeout_s, self.call_timeout_s = start_timeout_s, call_timeout_s
        self.task: Task | None = None
        self.trace: vf.Trace | None = None
        self._loop: _Loop | None = None
        self._episode: _Episode | None = None

    def tasks(self) -> list[Task]:
        """The taskset's rows as dsv32 tasks (ids: the row's id, else its name, else its position)."""
        tasks, seen = [], set()
        for row in self.taskset:
            data = row.data
            if data.prompt is None:
                raise InteropError(f"task {data.idx}: no prompt (a task a user opens is not playable here)")
            task_id = next((str(v) for v in (data.id, data.name) if v is not None), str(data.idx))
            task_id = task_id if task_id not in seen else f"{task_id}#{data.idx}"
            seen.add(task_id)
            dump = data.model_dump(mode="json")
            tasks.append(
                Task(
                    task_id,
                    data.prompt_text or f"task {task_id}",
                    dump.get("answer"),
                    "",
                    {"verifiers": dump},
                )
            )
        return tasks

    def _run(self, coro: Coroutine, timeout_s: float | None) -> Any:
        if self._loop is None:
            self._loop = _Loop()
        return self._loop.run(coro, timeout_s)

    def reset(self, task: Task) -> list[dict]:
        self.close()
        raw = task.info.get("verifiers")
        if not isinstance(raw, dict):
            raise InteropError(f"task {task.id!r}: no verifiers task data in info['verifiers'] (see tasks())")
        try:
            data = self.task_cls.data_type().model_validate(raw)
        except ValidationError as err:
            raise InteropError(f"task {task.id!r}: not {self.task_cls.__name__} data: {err}") from err
        vtask = self.task_cls(data, self.taskset.config.task)
        toolsets = [*vtask.toolsets(vtask.config), *type(self.taskset).toolsets(self.taskset.config)]
        episode = _Episode(vtask, toolsets)
        self._episode, self.task, self.trace = episode, task, episode.trace
        try:
            self._run(episode.open(), self.start_timeout_s)
        except Exception as err:  # a tool server that does not start is the environment's failure
            self.close()
            raise InteropError(f"task {task.id!r}: the verifiers episode did not start: {err}") from err
        messages = [{"role": "system", "content": data.system_prompt or SYSTEM_PROMPT}]
        if isinstance(data.prompt, str):
            return [*messages, {"role": "user", "content": data.prompt}]
        return [*messages, *to_openai(data.prompt)]

    def tools(self) -> list[dict]:
        return [dict(s) for s in self._episode.schemas] if self._episode is not None else []

    def call(self, name: str, arguments: dict) -> str:
        if self._episode is None:
            raise EnvError("call() before reset(): start an episode with env.reset(task)")
        if name not in self._episode.dispatch:
            return (
                f"error: unknown tool {name!r}; the tools are {', '.join(self._episode.dispatch) or 'none'}"
            )
        try:
            return self._run(self._episode.call(name, arguments), self.call_timeout_s)
        except Exception as err:  # the tool server failed the call: the model reads why
            return f"error: {name} failed: {type(err).__name__}: {err}"

    def call_bound_s(self, name: str) -> float:
        return self.call_timeout_s + 1.0

    def reward(self, trajectory: TrajectoryLike) -> Reward:
        if self._episode is None:
            raise EnvError("reward() before reset(): there is no episode to score")
        episode = self._episode
        try:
            trace = self._run(episode.score(list(trajectory.messages), trajectory.final), self.call_timeout_s)
        except Exception as err:  # verifiers' scoring failed: no verdict
            raise InteropError(f"the verifiers rewards failed: {type(err).__name__}: {err}") from err
        finally:
            self.close()
        self.trace = trace
        missing = [name for name, r in trace.rewards.items() if r is None]
        if missing:
            raise InteropError(f"the verifiers rewards {missing} gave no score")
        components = {name: r.score for name, r in trace.rewards.items()}
        reason = ", ".join(f"{name} {r.score:g} × {r.weight:g}" for name, r in trace.rewards.items())
        return Reward(trace.reward, components, f"verifiers rewards: {reason or 'none'}")

    def reference(self, task: Task) -> list[dict]:
        replies = task.info.get("reference")
        if not isinstance(replies, list):
            raise InteropError(
                f"task {task.id!r} has no reference solution: put its replies under info['reference']"
            )
        return [dict(r) for r in replies]

    def state(self) -> dict:
        trace = self.trace
        return {"task": self.task.id if self.task else None,
                "rewards": {k: (v.score if v else None) for k, v in trace.rewards.items()} if trace else {}}  # fmt: skip

    def close(self) -> None:
        episode, self._episode = self._episode, None
        loop, self._loop = self._loop, None
        if loop is None:
            return
        if episode is not None:
            with contextlib.suppress(Exception):  # a server already gone is closed
                loop.run(episode.close(), self.start_timeout_s)
        loop.stop()


def register_verifiers(
    name: str,
    taskset: str | vf.Taskset,
    config: dict | None = None,
    *,
    task_set: str = "default",
    **options: Any,
) -> EnvSpec:
    """Register a verifiers taskset as dsv32 environment ``name`` (its rows: task set ``task_set``), so
    ``run_episode`` and agentic GRPO built in this process can name it; ``options`` go to
    :class:`VerifiersEnvironment`."""
    opened = open_taskset(taskset, config)
    factory = functools.partial(VerifiersEnvironment, opened, **options)
    return register(EnvSpec(name, f"verifiers taskset {opened.config.id or type(opened).__name__}", factory,
                            {task_set: lambda: VerifiersEnvironment(opened).tasks()}))  # fmt: skip
