"""Any dsv32 environment over OpenEnv's HTTP/WebSocket protocol, built with openenv-core's own server.

:func:`build_app` wraps a registered environment (``dsv32.envs.get_env(name)``) in an OpenEnv
``Environment`` (:class:`SessionEnvironment`) and hands it to openenv-core's ``create_fastapi_app``,
so the routes, the WebSocket session protocol, the schemas and the session bookkeeping are
openenv-core's:

- ``/ws``: one session per WebSocket client, each with its own dsv32 environment (its own sandbox,
  kernel, database or repository copy), created on the client's first ``reset`` and closed when the
  client closes or goes away; at most ``max_sessions`` at once — one more is refused with OpenEnv's
  ``CAPACITY_REACHED`` error, and an idle session may be reaped after ``session_timeout_s``;
- ``/reset``, ``/step``, ``/state`` over plain HTTP are stateless in OpenEnv (a fresh environment per
  request): ``/reset`` shows a task's first observation, ``/step`` answers ``no_episode``;
- ``/schema``, ``/metadata``, ``/health``, and the OpenAPI docs at ``/docs``.

``reset`` picks a task of the served task set: ``task_id=...``, ``index=i``, ``seed=s`` (a
reproducible pick), or none (the next task, round robin); ``task_set=NAME`` picks from another
registered set of the same environment. The observation carries the system prompt and the task
(``messages``) and the tool specs; the task's answer never leaves the server. The reward is the dsv32
verifier's, given with ``done`` when the client sends the final answer. Tool calls go through the
same :class:`~dsv32.agent.tools.Toolbox` validation and time bounds as in dsv32's own agent loop.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import random
import socket
import threading
import time
import uuid
from typing import Any

import uvicorn
from fastapi import FastAPI, WebSocketDisconnect
from openenv.core.env_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment as OpenEnvEnvironmentBase
from openenv.core.env_server.mcp_types import Tool
from openenv.core.env_server.types import ConcurrencyConfig, EnvironmentMetadata

from dsv32.agent.episode import env_tools
from dsv32.agent.tools import Toolbox
from dsv32.envs.base import Environment, Episode, Task, get_env, resolve_tasks
from dsv32.interop.errors import InteropError
from dsv32.interop.openenv.models import (
    ActionError,
    DSV32Action,
    DSV32Observation,
    DSV32State,
    ErrorCode,
)


class TaskCatalog:
    """The tasks one server hands out and how to build its environments; shared by its sessions."""

    def __init__(self, env_name: str, tasks: str | None = None, options: dict | None = None) -> None:
        self.spec = get_env(env_name)
        self.env_name = env_name
        self.options = dict(options or {})
        self.task_set = tasks or next(iter(self.spec.task_sets), None)
        self.tasks = resolve_tasks(env_name, tasks)
        if not self.tasks:
            raise InteropError(f"environment {env_name!r}: the task set {self.task_set!r} is empty")
        self._sets: dict[str, dict[str, Task]] = {}
        self._turn = itertools.count()
        self._lock = threading.Lock()

    def make_env(self) -> Environment:
        return self.spec.factory(**self.options)

    def pick(
        self, task_id: str | None = None, index: int | None = None, seed: int | None = None,
        task_set: str | None = None,
    ) -> Task:  # fmt: skip
        """One task: by id, by index, by a seeded draw, or the next one in turn."""
        tasks = self._named_set(task_set) if task_set is not None else self.tasks
        if task_id is not None:
            by_id = {t.id: t for t in tasks}
            if str(task_id) not in by_id:
                raise InteropError(f"no task {task_id!r} in {self.env_name} {task_set or self.task_set}")
            return by_id[str(task_id)]
        if index is not None:
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(tasks):
                raise InteropError(f"index must be an integer in [0, {len(tasks)}), got {index!r}")
            return tasks[index]
        if seed is not None:
            return tasks[random.Random(seed).randrange(len(tasks))]
        with self._lock:
            return tasks[next(self._turn) % len(tasks)]

    def _named_set(self, name: str) -> list[Task]:
        if not isinstance(name, str) or name not in self.spec.task_sets:
            known = ", ".join(self.spec.task_sets) or "none"
            raise InteropError(f"{self.env_name} has no task set {name!r} (a reset names one of: {known})")
        with self._lock:
            if name not in self._sets:
                self._sets[name] = {t.id: t for t in self.spec.task_sets[name]()}
        return list(self._sets[name].values())


def openenv_tools(schemas: list[dict]) -> list[Tool]:
    """OpenAI function schemas as OpenEnv's MCP tool specs."""
    specs = []
    for schema in schemas:
        function = schema.get("function", schema)
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        specs.append(
            Tool(name=function["name"], description=function.get("description", ""), input_schema=parameters)
        )
    return specs


def _code(kind: str | None) -> ErrorCode:
    """The error code of a failed call's kind (a kind this server does not know: environment_error)."""
    try:
        return ErrorCode(kind)
    except ValueError:
        return ErrorCode.ENVIRONMENT_ERROR


def _failed(code: ErrorCode, message: str, **fields: Any) -> DSV32Observation:
    return DSV32Observation(error=ActionError(code=code, message=message), **fields)


class SessionEnvironment(OpenEnvEnvironmentBase[DSV32Action, DSV32Observation, DSV32State]):
    """One OpenEnv session: one dsv32 environment (built at the first ``reset``) and its episode."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session builds an environment of its own

    def __init__(self, catalog: TaskCatalog) -> None:
        super().__init__()
        self.catalog = catalog
        self.env: Environment | None = None
        self.toolbox: Toolbox | None = None
        self.task: Task | None = None
        self.messages: list[dict] = []
        self.tools: list[Tool] = []
        self.done = False
        self.reward: float | None = None
        self.episode_id: str | None = None
        self.steps = 0

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, task_id: str | None = None,
        index: int | None = None, task_set: str | None = None, **unknown: Any,
    ) -> DSV32Observation:  # fmt: skip
        if unknown:
            return _failed(
                ErrorCode.INVALID_ACTION,
                f"unknown reset argument(s) {sorted(unknown)}; reset takes task_id, index, seed, task_set "
                "and episode_id",
                done=True,
            )
        try:
            task = self.catalog.pick(task_id, index, seed, task_set)
        except InteropError as err:
            return _failed(ErrorCode.UNKNOWN_TASK, str(err), done=True)
        self.task, self.done, self.reward, self.steps = None, False, None, 0
        self.episode_id = episode_id or uuid.uuid4().hex
        try:
            if self.env is None:
                self.env = self.catalog.make_env()
            messages = self.env.reset(task)
            schemas = self.env.tools()
            self.toolbox = Toolbox(env_tools(self.env))
        except Exception as err:  # a failing environment is the server's to report, not to die of
            return _failed(
                ErrorCode.ENVIRONMENT_ERROR,
                f"the environment's reset failed: {type(err).__name__}: {err}",
                task_id=task.id, done=True,
            )  # fmt: skip
        self.task, self.messages, self.tools = task, list(messages), openenv_tools(schemas)
        return DSV32Observation(task_id=task.id, messages=list(messages), tools=self.tools)

    def step(self, action: DSV32Action, timeout_s: float | None = None, **kwargs: Any) -> DSV32Observation:
        if self.task is None or self.toolbox is None:
            return _failed(
                ErrorCode.NO_EPISODE,
                "no episode: reset first; over plain HTTP every request is a fresh environment, so an "
                "episode needs a WebSocket session (/ws, as openenv-core's EnvClient opens)",
            )
        task_id = self.task.id
        if self.done:
            return _failed(ErrorCode.EPISODE_DONE, "the episode is done; reset to start another", done=True,
                           task_id=task_id)  # fmt: skip
        self.steps += 1
        if action.type == "list_tools":
            return DSV32Observation(task_id=task_id, tools=self.tools)
        if action.type == "call_tool":
            return self._call(action)
        return self._finish(action)

    def _call(self, action: DSV32Action) -> DSV32Observation:
        if not action.tool_name:
            return _failed(ErrorCode.INVALID_ACTION, "call_tool needs tool_name (and arguments)",
                           task_id=self.task.id)  # fmt: skip
        raw = action.arguments if action.arguments is not None else {}
        text = raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False)
        call = {
            "id": f"call-{self.steps}",
            "type": "function",
            "function": {"name": action.tool_name, "arguments": text},
        }
        output = self.toolbox.execute({"function": {"name": action.tool_name, "arguments": raw}})
        turn: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": [call]}
        if action.reasoning_content:
            turn["reasoning_content"] = action.reasoning_content
        self.messages += [turn, {"role": "tool", "tool_call_id": call["id"], "content": output.content}]
        error = None if output.ok else ActionError(code=_code(output.error), message=output.content)
        return DSV32Observation(
            task_id=self.task.id, tool_name=action.tool_name, result=output.content, error=error
        )

    def _finish(self, action: DSV32Action) -> DSV32Observation:
        if action.content is None:
            return _failed(ErrorCode.INVALID_ACTION, "final_answer needs content (the final message)",
                           task_id=self.task.id)  # fmt: skip
        turn: dict[str, Any] = {"role": "assistant", "content": action.content}
        if action.reasoning_content:
            turn["reasoning_content"] = action.reasoning_content
        self.messages.append(turn)
        self.done = True
        try:
            verdict = self.env.reward(Episode(list(self.messages), action.content))
        except Exception as err:  # the verifier failed: no verdict, and the server stays up
            return _failed(
                ErrorCode.ENVIRONMENT_ERROR,
                f"the verifier failed: {type(err).__name__}: {err}",
                task_id=self.task.id, done=True, scored=False, reason="not scored",
            )  # fmt: skip
        self.reward = float(verdict.value) if verdict.scored else None
        return DSV32Observation(
            task_id=self.task.id, done=True, reward=self.reward, scored=verdict.scored,
            reward_components=dict(verdict.components), reason=verdict.reason,
        )  # fmt: skip

    @property
    def state(self) -> DSV32State:
        try:
            env_state = self.env.state() if self.env is not None and self.task is not None else {}
        except Exception as err:  # a state() that fails is shown, not raised
            env_state = {"error": f"{type(err).__name__}: {err}"}
        return DSV32State(
            episode_id=self.episode_id, step_count=self.steps, env=self.catalog.env_name,
            task_id=self.task.id if self.task else None, done=self.done, reward=self.reward,
            env_state=json.loads(json.dumps(env_state, default=str)),
        )  # fmt: skip

    def get_metadata(self) -> EnvironmentMetadata:
        spec = self.catalog.spec
        return EnvironmentMetadata(
            name=f"dsv32 {spec.name}",
            description=f"{spec.description} (task set {self.catalog.task_set}, {len(self.catalog.tasks)} tasks)",
            version=_version(),
        )

    def close(self) -> None:
        env, self.env = self.env, None
        if env is not None:
            env.close()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dsv32")
    except PackageNotFoundError:
        return "0"


def build_app(
    env_name: str, *, tasks: str | None = None, max_sessions: int = 4, options: dict | None = None,
    session_timeout_s: float | None = None,
) -> FastAPI:  # fmt: skip
    """The OpenEnv FastAPI app of environment ``env_name`` (its task set ``tasks``: a registered name or
    a JSONL file; its factory's keyword ``options``), with at most ``max_sessions`` WebSocket sessions."""
    if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1:
        raise InteropError(f"max_sessions must be a positive integer, got {max_sessions!r}")
    if session_timeout_s is not None and not session_timeout_s > 0:
        raise InteropError(f"session_timeout_s must be > 0 seconds, got {session_timeout_s!r}")
    catalog = TaskCatalog(env_name, tasks, options)
    limits = ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=session_timeout_s)
    factory = functools.partial(SessionEnvironment, catalog)
    app = create_fastapi_app(factory, DSV32Action, DSV32Observation, concurrency_config=limits)
    app.add_middleware(SessionSockets)
    app.state.catalog = catalog
    return app


class SessionSockets:
    """ASGI middleware around openenv-core's WebSocket sessions.

    - A refused session (``CAPACITY_REACHED``: the server already holds ``max_sessions``) is closed
      with code 1013 (try again later) and the refusal as the close reason, so a client that sent its
      ``reset`` before reading the refusal still learns why the socket closed.
    - openenv-core closes each session's socket after its client has already closed it, which raises
      ``WebSocketDisconnect`` on every normal end of a session; that is not a fault, so it is not
      reported as one.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return await self.app(scope, receive, send)
        refusal: str | None = None

        async def sending(message: dict) -> None:
            nonlocal refusal
            text = message.get("text") if message["type"] == "websocket.send" else None
            if refusal is None and text and '"CAPACITY_REACHED"' in text:
                refusal = str(json.loads(text).get("data", {}).get("message", "server at capacity"))
            if message["type"] == "websocket.close" and refusal is not None:
                message = {**message, "code": 1013, "reason": refusal.encode()[:120].decode(errors="ignore")}
            await send(message)

        with contextlib.suppress(WebSocketDisconnect):
            await self.app(scope, receive, sending)


def serve(app: FastAPI, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve ``app`` until interrupted."""
    uvicorn.run(app, host=host, port=port, log_level="warning")


class ServerThread:
    """``app`` served from a background thread (tests, notebooks): ``with ServerThread(app) as s:
    s.url``. ``port=0`` takes a free port."""

    def __init__(
        self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, start_timeout_s: float = 30
    ) -> None:
        self.app, self.host, self.port, self.start_timeout_s = app, host, port, start_timeout_s
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> ServerThread:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning"))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="openenv-server", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise InteropError(f"the OpenEnv server did not start on {self.url}")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
