"""An OpenEnv server as a dsv32 environment, played through openenv-core's own client.

``OpenEnvEnvironment(base_url)`` opens one WebSocket session per episode (``reset``) with
openenv-core's ``GenericEnvClient`` and closes it with the episode (``reset`` again, or ``close``).
What the model sees depends on the server's action schema (``GET /schema``):

- a dsv32 server (``dsv32 envs serve``; its action types include ``final_answer``): the system prompt,
  the task and the tools of the served environment; each tool call is a ``call_tool`` action and the
  final answer a ``final_answer`` action, whose reward is the dsv32 verifier's;
- a tool-calling (MCP) OpenEnv server (``tool_name`` in its action schema): its tools from a
  ``list_tools`` action, each call a ``call_tool`` action;
- any other OpenEnv server: one tool named after its action class whose parameters are the action's
  fields; a call is one ``step``. With ``answer_field`` set, the final answer is also sent as
  ``{answer_field: final}`` when the episode has not ended by then.

The reward is the server's reward at ``done`` (:class:`~dsv32.envs.Reward` ``openenv`` component); an
episode the server never ended scores 0, and a ``done`` without a reward is not scored. A call the
server refuses is an ``error:`` text for the model, never an exception. Tasks are reset arguments:
``task.info["reset"]`` (:func:`openenv_tasks`); :func:`register_openenv` registers a server under a
name, so ``run_episode`` and agentic GRPO recipes can name it like a shipped environment.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import threading
from typing import Any

import httpx
from openenv.core.generic_client import GenericEnvClient
from openenv.core.utils import convert_to_ws_url

from dsv32.envs.base import EnvError, Environment, EnvSpec, Reward, Task, TrajectoryLike, register
from dsv32.interop.errors import InteropError

SYSTEM_PROMPT = (
    "You act in an environment through its tools: each tool call is one action, and its result is the "
    "environment's next observation. When the task is done, give your final answer."
)
_MCP_TITLES = {"Action", "CallToolAction", "ListToolsAction"}


def openenv_tasks(
    resets: list[dict] | int = 1, prompt: str = "Solve the environment's task.", prefix: str = "openenv"
) -> list[Task]:
    """Tasks for an OpenEnv server: one per dict of ``reset`` arguments (or ``n`` tasks reset with
    ``seed=0..n-1``). ``prompt`` comes before the first observation in the user message (a dsv32
    server sends its own task instead)."""
    if isinstance(resets, int):
        resets = [{"seed": i} for i in range(resets)]
    for i, kwargs in enumerate(resets):
        if not isinstance(kwargs, dict):
            raise InteropError(f"resets[{i}]: reset arguments are a dict, got {type(kwargs).__name__}")
    return [Task(f"{prefix}-{i}", prompt, info={"reset": dict(kwargs)}) for i, kwargs in enumerate(resets)]


def register_openenv(
    name: str, base_url: str, tasks: list[Task] | None = None, *, task_set: str = "default", **options: Any
) -> EnvSpec:
    """Register the server at ``base_url`` as environment ``name`` (its tasks: ``tasks``, else one
    reset with ``seed=0``); ``options`` go to :class:`OpenEnvEnvironment`."""
    tasks = list(tasks) if tasks is not None else openenv_tasks(1)
    factory = functools.partial(OpenEnvEnvironment, base_url, **options)
    return register(EnvSpec(name, f"OpenEnv server at {base_url}", factory, {task_set: lambda: list(tasks)}))


def _snake(title: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", title).lower() or "act"


def _text(value: Any) -> str:
    """An observation's tool result as text (an MCP ``CallToolResult`` as its text parts)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), list):
        parts = [
            p.get("text", "") for p in value["content"] if isinstance(p, dict) and p.get("type") == "text"
        ]
        if parts:
            return "\n".join(parts)
    return json.dumps(value, ensure_ascii=False, default=str)


class OpenEnvEnvironment(Environment):
    """One episode at a time on the OpenEnv server at ``base_url`` (``http://`` or ``ws://``)."""

    name = "openenv"
    description = "an OpenEnv server, played through openenv-core's client"

    def __init__(
        self, base_url: str, *, answer_field: str | None = None, system_prompt: str | None = None,
        connect_timeout_s: float = 10.0, message_timeout_s: float = 120.0,
    ) -> None:  # fmt: skip
        if not isinstance(base_url, str) or not base_url.startswith(
            ("http://", "https://", "ws://", "wss://")
        ):
            raise InteropError(f"base_url must be an http(s):// or ws(s):// URL, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.http_url = convert_to_ws_url(self.base_url).replace("ws", "http", 1)
        self.answer_field, self.system_prompt = answer_field, system_prompt
        self.connect_timeout_s, self.message_timeout_s = connect_timeout_s, message_timeout_s
        self.task: Task | None = None
        self._client = None
        self._lock = threading.Lock()  # one message in flight per session: the socket pairs send/receive
        self._action_schema: dict | None = None
        self._tools: list[dict] = []
        self._done, self._reward, self._last, self._steps = False, None, {}, 0

    # --- the server's protocol ------------------------------------------------------------------

    def _schema(self) -> dict:
        if self._action_schema is None:
            try:
                response = httpx.get(f"{self.http_url}/schema", timeout=self.connect_timeout_s)
                response.raise_for_status()
                self._action_schema = response.json()["action"]
            except (httpx.HTTPError, KeyError, ValueError) as err:
                raise InteropError(f"no OpenEnv schema at {self.http_url}/schema: {err}") from err
        return self._action_schema

    @property
    def protocol(self) -> str:
        """``dsv32`` (a dsv32 server), ``tools`` (an MCP tool-calling server) or ``action``."""
        schema = self._schema()
        fields = schema.get("properties", {})
        kind = fields.get("type", {})
        types = set(kind.get("enum", [])) | ({kind["const"]} if "const" in kind else set())
        if "final_answer" in types:
            return "dsv32"
        if "tool_name" in fields or schema.get("title") in _MCP_TITLES:
            return "tools"
        return "action"

    def _action_tool(self) -> dict:
        schema = self._schema()
        fields = {k: v for k, v in schema.get("properties", {}).items() if k != "metadata"}
        parameters = {
            "type": "object",
            "properties": fields,
            "required": [r for r in schema.get("required", []) if r in fields],
        }
        if "$defs" in schema:
            parameters["$defs"] = schema["$defs"]
        description = schema.get("description") or "Send one action to the environment."
        return {
            "type": "function",
            "function": {
                "name": _snake(schema.get("title", "act")),
                "description": description,
                "parameters": parameters,
            },
        }

    def _step(self, action: dict) -> Any:
        with self._lock:
            result = self._client.step(action)
        self._steps += 1
        self._last = result.observation if isinstance(result.observation, dict) else {}
        if result.done:
            self._done, self._reward = True, result.reward
        return result

    # --- the dsv32 environment interface --------------------------------------------------------

    def reset(self, task: Task) -> list[dict]:
        reset_args = task.info.get("reset", {})
        if not isinstance(reset_args, dict):
            raise InteropError(f"task {task.id!r}: info['reset'] must be a dict of reset arguments")
        self.close()
        protocol = self.protocol
        client = GenericEnvClient(
            self.base_url, connect_timeout_s=self.connect_timeout_s, message_timeout_s=self.message_timeout_s
        ).sync()
        try:
            client.connect()
            result = client.reset(**reset_args)
        except Exception as err:  # a refused session (capacity, a dead server) is the server's failure
            client.close()
            raise InteropError(f"the OpenEnv server at {self.base_url} refused the session: {err}") from err
        self._client, self.task = client, task
        self._done, self._reward, self._steps = bool(result.done), result.reward, 0
        observation = (
            result.observation
            if isinstance(result.observation, dict)
            else {"observation": result.observation}
        )
        self._last = observation
        if protocol == "dsv32" and observation.get("error"):
            raise InteropError(f"the dsv32 server refused the reset: {observation['error'].get('message')}")
        if protocol == "action":
            self._tools = [self._action_tool()]
        else:
            specs = observation.get("tools")
            if protocol == "tools" or not specs:
                specs = self._list_tools()
            self._tools = [
                {"type": "function", "function": {"name": s["name"], "description": s.get("description", ""),
                                                  "parameters": s.get("input_schema") or s.get("inputSchema") or {"type": "object", "properties": {}}}}
                for s in specs
            ]  # fmt: skip
        messages = observation.get("messages") if protocol == "dsv32" else None
        if not messages:
            shown = {k: v for k, v in observation.items() if k not in ("tools", "messages")}
            body = json.dumps(shown, ensure_ascii=False, default=str)
            messages = [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": f"{task.prompt}\n\n{body}"},
            ]
        messages = [dict(m) for m in messages]
        if self.system_prompt is not None and messages and messages[0].get("role") == "system":
            messages[0]["content"] = self.system_prompt
        return messages

    def _list_tools(self) -> list[dict]:
        try:
            result = self._step({"type": "list_tools"})
        except Exception as err:  # a server without list_tools has no tools to offer
            raise InteropError(
                f"the OpenEnv server at {self.base_url} did not list its tools: {err}"
            ) from err
        tools = result.observation.get("tools") if isinstance(result.observation, dict) else None
        if not isinstance(tools, list):
            raise InteropError(f"the OpenEnv server at {self.base_url} answered list_tools without tools")
        return tools

    def tools(self) -> list[dict]:
        return [dict(t) for t in self._tools]

    def call(self, name: str, arguments: dict) -> str:
        if self.task is None or self._client is None:
            raise EnvError("call() before reset(): start an episode with env.reset(task)")
        if self._done:
            return "error: the environment has ended the episode; give your final answer"
        known = [t["function"]["name"] for t in self._tools]
        if name not in known:
            return f"error: unknown tool {name!r}; the tools are {', '.join(known)}"
        protocol = self.protocol
        action = (
            arguments
            if protocol == "action"
            else {"type": "call_tool", "tool_name": name, "arguments": arguments}
        )
        try:
            result = self._step(action)
        except Exception as err:  # the server refused the action: the model reads why
            return f"error: the environment refused the action: {err}"
        observation = (
            result.observation
            if isinstance(result.observation, dict)
            else {"observation": result.observation}
        )
        if protocol == "action":
            text = json.dumps(observation, ensure_ascii=False, default=str)
        elif observation.get("result") is not None:
            text = _text(observation["result"])
        elif observation.get("error"):
            error = observation["error"]
            text = f"error: {error.get('message', error) if isinstance(error, dict) else error}"
        else:
            text = json.dumps(observation, ensure_ascii=False, default=str)
        return text + ("\n(The environment has ended the episode.)" if result.done else "")

    def call_bound_s(self, name: str) -> float:
        """A call returns (or fails) within the client's message timeout."""
        return self.message_timeout_s + 1.0

    def reward(self, trajectory: TrajectoryLike) -> Reward:
        if self.task is None or self._client is None:
            raise EnvError("reward() before reset(): there is no episode to score")
        protocol = self.protocol
        if not self._done and trajectory.final is not None:
            if protocol == "dsv32":
                self._finish({"type": "final_answer", "content": trajectory.final})
            elif protocol == "action" and self.answer_field:
                self._finish({self.answer_field: trajectory.final})
        if not self._done:
            return Reward(0.0, {"openenv": 0.0}, "the server did not end the episode (no done)")
        if self._reward is None:
            reason = self._last.get("reason") or "the server gave no reward at done"
            return Reward(0.0, {}, f"not scored: {reason}", scored=False)
        value = float(self._reward)
        components = {"openenv": value, **dict(self._last.get("reward_components") or {})}
        return Reward(
            value, components, self._last.get("reason") or f"the server's reward at done: {value:g}"
        )

    def _finish(self, action: dict) -> None:
        try:
            self._step(action)
        except Exception as err:  # no verdict: the environment failed, not the model
            raise InteropError(f"the OpenEnv server refused the final answer: {err}") from err

    def reference(self, task: Task) -> list[dict]:
        replies = task.info.get("reference")
        if not isinstance(replies, list):
            raise InteropError(
                f"task {task.id!r} has no reference solution (an OpenEnv server does not send one): put the "
                "assistant messages that solve it under info['reference']"
            )
        return [dict(r) for r in replies]

    def state(self) -> dict:
        return {"base_url": self.base_url, "task": self.task.id if self.task else None,
                "steps": self._steps, "done": self._done, "reward": self._reward}  # fmt: skip

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):  # closing a socket the server already dropped
                client.close()
