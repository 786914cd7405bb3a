"""The environment interface every ``dsv32.envs`` environment implements (paper §3.2.3).

It has the shape of OpenEnv's ``reset`` / ``step`` / ``state``, so adapters to OpenEnv, verifiers or
TRL's ``environment_factory`` stay thin:

- ``env.reset(task) -> messages``: the system prompt and the user's task, OpenAI-style;
- ``env.tools() -> list[dict]``: OpenAI tool schemas (``{"type": "function", "function": {...}}``);
- ``env.call(name, arguments) -> str``: run one tool call; a bad call returns an error text, it never
  raises (the model sees the text next);
- ``env.reward(trajectory) -> Reward``: the verifier, over the finished episode;
- ``env.reference(task) -> list[dict]``: the task's reference solution as the assistant messages that
  play it (``tool_calls`` turns, then a final answer) — ``--backend reference`` replays them through
  the same tools and verifier, and must score 1.0;
- ``env.state() -> dict``: what the episode has done so far (for logs and adapters);
- ``env.close()``: free what the episode holds (kernels, sandboxes, copies of repositories).

A trajectory is anything with ``messages`` (the OpenAI-style conversation, tool results included) and
``final`` (the answer text, or None): :class:`dsv32.agent.Trajectory` is one; so is
:class:`Episode` below, which tests and adapters can build by hand. This package never imports the agent.
"""

from __future__ import annotations

import functools
import json
import os
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from dsv32.chat.validate import unencodable
from dsv32.errors import DSV32Error
from dsv32.jsonl import read_jsonl


class EnvError(DSV32Error, ValueError):
    """A bad task file, an unknown environment or task set, a task the environment cannot run."""


@dataclass
class Task:
    """One task: a JSONL row ``{"id", "prompt", "answer", "domain", "info"}``. ``answer`` is the
    ground truth for exact-answer tasks (None where a verifier in ``info`` decides); ``info`` holds
    whatever else the environment needs (verifier data, a repository snapshot, a database)."""

    id: str
    prompt: str
    answer: Any = None
    domain: str = ""
    info: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, row: dict, where: str = "task") -> Task:
        if not isinstance(row, dict):
            raise EnvError(f"{where}: a task is a JSON object, got {type(row).__name__}")
        missing = [k for k in ("id", "prompt") if k not in row]
        if missing:
            raise EnvError(f"{where}: missing field(s) {missing} (a task needs id and prompt)")
        unknown = sorted(set(row) - {"id", "prompt", "answer", "domain", "info"})
        if unknown:
            raise EnvError(f"{where}: unknown field(s) {unknown}; put extra data under 'info'")
        if not isinstance(row["prompt"], str) or not row["prompt"].strip():
            raise EnvError(f"{where}: 'prompt' must be a non-empty string")
        task_id = row["id"]
        if isinstance(task_id, bool) or not isinstance(task_id, (str, int)) or task_id == "":
            raise EnvError(f"{where}: 'id' must be a non-empty string or an integer, got {task_id!r}")
        domain = row.get("domain", "")
        if not isinstance(domain, str):
            raise EnvError(f"{where}: 'domain' must be a string, got {domain!r}")
        info = row.get("info") or {}
        if not isinstance(info, dict):
            raise EnvError(f"{where}: 'info' must be a JSON object")
        return cls(str(task_id), row["prompt"], row.get("answer"), domain, info)

    def to_dict(self) -> dict:
        return asdict(self)


# Every task file this process has read (real paths): the sandbox masks them, so a sandboxed program
# cannot read the answers of the tasks it is given.
TASK_FILES: set[str] = set()


def load_tasks(path: str | Path) -> list[Task]:
    """Tasks from a JSONL file (one object per line; blank lines skipped); errors name the line.
    The file is added to :data:`TASK_FILES`."""
    TASK_FILES.add(os.path.realpath(path))
    tasks, seen = [], set()
    for n, row in read_jsonl(path, EnvError):
        task = Task.from_dict(row, f"{path}:{n}")
        if task.id in seen:
            raise EnvError(f"{path}:{n}: duplicate task id {task.id!r}")
        seen.add(task.id)
        tasks.append(task)
    return tasks


def task_plan(
    n: int, seed: int, difficulty: int | None, categories: tuple[str, ...], known: Mapping, what: str
) -> Iterator[tuple[int, str, int, random.Random]]:
    """The plan of a generated task set: ``(i, category, difficulty, rng)`` for task ``i`` of ``n``,
    cycling through ``categories`` and, when ``difficulty`` is None, through difficulties 1..5 as
    well; ``rng`` is ``random.Random(f"{seed}:{i}")``. Checks ``categories`` against ``known``
    (``what`` names them in the error) and the difficulty before the first task."""
    unknown = sorted(set(categories) - set(known))
    if unknown:
        raise EnvError(f"unknown {what} categories {unknown}; known: {', '.join(known)}")
    if difficulty is not None and not 1 <= difficulty <= 5:
        raise EnvError(f"difficulty must be 1..5, got {difficulty}")
    return (
        (
            i,
            categories[i % len(categories)],
            difficulty or 1 + (i // len(categories)) % 5,
            random.Random(f"{seed}:{i}"),
        )
        for i in range(n)
    )


def save_tasks(tasks: Iterable[Task], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for task in tasks:
            f.write(json.dumps(task.to_dict(), ensure_ascii=False) + "\n")
    return path


@dataclass
class Reward:
    """The verifier's verdict: ``value`` in [0, 1], named ``components`` and a human ``reason``;
    ``scored`` False when there is no verdict (the environment failed: ``value`` is then 0 and says
    nothing of the episode)."""

    value: float
    components: dict[str, float] = field(default_factory=dict)
    reason: str = ""
    scored: bool = True


class TrajectoryLike(Protocol):
    messages: list[dict]
    final: str | None


@dataclass
class Episode:
    """A minimal trajectory: the conversation and the final answer."""

    messages: list[dict]
    final: str | None = None


def tool_schema(name: str, description: str, properties: dict, required: list[str] | None = None) -> dict:
    """An OpenAI function-tool schema."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(properties) if required is None else required,
            },
        },
    }


def tool_call(name: str, arguments: dict, call_id: str) -> dict:
    """One OpenAI-style tool call (``arguments`` as a JSON string), for reference solutions."""
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def lone_surrogate(arguments: Any, name: str = "the arguments") -> str | None:
    """The ``error:`` text for tool-call ``arguments`` with a string UTF-8 cannot encode (a lone
    surrogate such as ``"\\ud83d"``, which JSON's ``\\u`` escapes can carry), else None. Looks into
    every string, list item, object key and value; names the argument it is under."""
    found = unencodable(arguments)
    if found is None:
        return None
    steps, is_key, position, char = found
    keys = [step for step in steps if isinstance(step, str)]
    owner = f"argument {keys[0]!r}" if keys and name == "the arguments" else name
    return (
        f"error: {f'an argument name in {owner}' if is_key else owner} holds the lone surrogate {char!r} "
        f"(at character {position}), which UTF-8 cannot encode; write the character itself or a complete "
        "surrogate pair"
    )


class Environment(ABC):
    """Base class: subclasses set ``name`` and implement ``reset``, ``tools``, ``call``, ``reward``,
    ``reference``; ``state`` and ``close`` have defaults.

    Every subclass's ``reset`` also takes a task's JSONL row as a dict (it receives the
    :class:`Task`), and its ``reward`` refuses what is not a trajectory with an :class:`EnvError`:
    the base class wraps both when the subclass is defined, so no environment repeats the checks."""

    name: str = ""
    description: str = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "reset" in cls.__dict__:
            cls.reset = _taking_task_rows(cls.__dict__["reset"])
        if "reward" in cls.__dict__:
            cls.reward = _refusing_non_trajectories(cls.__dict__["reward"])

    @abstractmethod
    def reset(self, task: Task) -> list[dict]: ...

    @abstractmethod
    def tools(self) -> list[dict]: ...

    @abstractmethod
    def call(self, name: str, arguments: dict) -> str: ...

    @abstractmethod
    def reward(self, trajectory: TrajectoryLike) -> Reward: ...

    @abstractmethod
    def reference(self, task: Task) -> list[dict]: ...

    def call_bound_s(self, name: str) -> float | None:
        """The longest ``call(name, …)`` can take, for an environment that bounds its calls itself
        (its own limits on starting a kernel, on a cell, on waiting for an earlier call): the agent
        waits that long for the call instead of its generic tool timeout, so an environment slow to
        start under load is not reported to the model as its code timing out. None (the default):
        not bounded here, the agent's tool timeout applies."""
        return None

    def state(self) -> dict:
        return {}

    def close(self) -> None:
        return None

    def __enter__(self) -> Environment:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _taking_task_rows(reset: Callable) -> Callable:
    @functools.wraps(reset)
    def wrapped(self, task: Any, *args: Any, **kwargs: Any) -> list[dict]:
        if isinstance(task, dict):
            task = Task.from_dict(task)
        elif not isinstance(task, Task):
            raise EnvError(f"reset() takes a Task (or its JSONL row as a dict), got {type(task).__name__}")
        return reset(self, task, *args, **kwargs)

    return wrapped


def _refusing_non_trajectories(reward: Callable) -> Callable:
    @functools.wraps(reward)
    def wrapped(self, trajectory: Any, *args: Any, **kwargs: Any) -> Reward:
        final = getattr(trajectory, "final", ...)
        if not hasattr(trajectory, "messages") or not (final is None or isinstance(final, str)):
            raise EnvError(
                "reward() takes a trajectory (an agent Trajectory or an envs Episode: .messages and a "
                f"string or None .final), got {type(trajectory).__name__}"
            )
        return reward(self, trajectory, *args, **kwargs)

    return wrapped


@dataclass
class EnvSpec:
    """A registered environment: how to build it and which task sets it ships (name → loader)."""

    name: str
    description: str
    factory: Callable[..., Environment]
    task_sets: dict[str, Callable[[], list[Task]]] = field(default_factory=dict)


_REGISTRY: dict[str, EnvSpec] = {}


def register(spec: EnvSpec) -> EnvSpec:
    _REGISTRY[spec.name] = spec
    return spec


# The modules of the shipped environments; each registers itself with :func:`register` on import.
SHIPPED = ("search", "interpreter", "general", "swe")


def _load_shipped() -> None:
    import importlib

    for module in SHIPPED:
        importlib.import_module(f"dsv32.envs.{module}")


def registry() -> dict[str, EnvSpec]:
    """Every registered environment: the shipped ones and any registered by the user."""
    _load_shipped()
    return dict(_REGISTRY)


def get_env(name: str) -> EnvSpec:
    _load_shipped()
    if name not in _REGISTRY:
        raise EnvError(f"unknown environment {name!r}; known: {', '.join(sorted(_REGISTRY)) or 'none'}")
    return _REGISTRY[name]


def resolve_tasks(env: str, tasks: str | None = None) -> list[Task]:
    """Tasks for environment ``env``: a JSONL path, one of its registered task sets by name, or (None)
    its first task set."""
    spec = get_env(env)
    if tasks is not None and Path(tasks).suffix == ".jsonl":
        return load_tasks(tasks)
    if not spec.task_sets:
        raise EnvError(f"environment {env!r} ships no task set; pass a JSONL file of tasks")
    key = tasks or next(iter(spec.task_sets))
    if key not in spec.task_sets:
        raise EnvError(f"environment {env!r} has no task set {key!r}; known: {', '.join(spec.task_sets)}")
    return spec.task_sets[key]()


def replay(env: Environment, task: Task, replies: list[dict]) -> Episode:
    """Play assistant ``replies`` (e.g. ``env.reference(task)``) through ``env``'s tools without a
    model or the agent: reset, run every tool call in order (results appended as ``tool``
    messages), and return the episode, whose ``final`` is the last reply's content. For golden
    checks and adapters; ``dsv32.agent`` does the same with a model."""
    messages = env.reset(task)
    for reply in replies:
        messages.append(reply)
        for call in reply.get("tool_calls") or []:
            try:
                arguments = json.loads(call["function"]["arguments"] or "{}")
            except json.JSONDecodeError as err:
                raise EnvError(f"tool call {call.get('id')!r}: arguments are not JSON ({err.msg})") from err
            result = env.call(call["function"]["name"], arguments)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    final = replies[-1].get("content") if replies and not replies[-1].get("tool_calls") else None
    return Episode(messages, final)
