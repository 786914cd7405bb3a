"""``dsv32 agent run``: one agent episode, streamed to the terminal and written as a trajectory.

Backends: ``openai`` (``--base-url URL --model NAME``, any OpenAI-compatible endpoint), ``local CKPT``
(a native V3.2 checkpoint, ``smollm2``, a Hugging Face model directory), ``reference`` (replays an
environment's reference solution; needs ``--env``). The task is ``--task TEXT`` or a task of an
environment (``--env NAME [--tasks SET|FILE] [--task-id ID]``), whose tools and verifier are used.
``--tool module:function`` adds Python functions as tools. Writes ``trajectory.json`` and
``steps.jsonl`` (one line per step) under ``--out`` (default: a new ``runs/agent/<time>``), a
directory created, and so checked, before the episode runs.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
import time
from pathlib import Path

from dsv32.cli import add_backend, check_backend_flags, command, non_negative_float, positive_int, probability


class Printer:
    """Streams an episode: reasoning (dim), the answer, tool calls and results, context resets."""

    def __init__(self, stream=None, max_result_chars: int = 400) -> None:
        self.out = stream or sys.stdout
        self.kind = None
        self.max_result_chars = max_result_chars
        color = hasattr(self.out, "isatty") and self.out.isatty()
        self.dim, self.reset = ("\033[2m", "\033[0m") if color else ("", "")

    def _end_stream(self) -> None:
        """End the reasoning or answer being streamed, if any, with its line."""
        if self.kind is not None:
            self.out.write(self.reset + "\n")
            self.kind = None

    def _line(self, text: str) -> None:
        self._end_stream()
        self.out.write(text + "\n")
        self.out.flush()

    def __call__(self, kind: str, payload: dict) -> None:
        if kind == "delta":
            if payload["kind"] != self.kind:
                self._end_stream()
                label = "thinking: " if payload["kind"] == "reasoning" else "answer: "
                self.out.write((self.dim if payload["kind"] == "reasoning" else "") + label)
                self.kind = payload["kind"]
            self.out.write(payload["text"])
            self.out.flush()
        elif kind == "thread":
            if payload["thread"]:
                self._line(f"=== trajectory {payload['thread'] + 1} ===")
        elif kind == "tool_call":
            self._line(f"→ {payload['name']}({payload['arguments']})")
        elif kind == "tool_result":
            text = payload["content"]
            if len(text) > self.max_result_chars:
                text = text[: self.max_result_chars] + f" … ({len(payload['content'])} characters)"
            self._line(("← " if payload["ok"] else "← [error] ") + text.replace("\n", "\n  "))
        elif kind == "call_error":
            self._line("← [error] " + payload["content"].replace("\n", "\n  "))
        elif kind == "context":
            self._line(
                f"⟲ context reset ({payload['strategy']}) before step {payload['step']}: "
                f"{payload['tokens_before']} → {payload['tokens_after']} tokens"
            )
        elif kind == "stop":
            self._line(f"■ {payload['stop_reason']}")


def _load_tools(specs: list[str]) -> list:
    """``module:function`` specs → the functions; modules are found on ``sys.path`` and, as with
    ``python -m``, in the current directory."""
    import importlib
    import os
    import sys

    from dsv32.agent import AgentError

    if specs and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    tools = []
    for spec in specs:
        module, _, name = spec.partition(":")
        if not module or not name:
            raise AgentError(f"--tool {spec!r}: write it as module:function")
        try:
            tools.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError) as err:
            raise AgentError(f"--tool {spec!r}: {err}") from err
    return tools


def _backend(args: argparse.Namespace, reference: list | None):
    from dsv32.agent import AgentError, LocalBackend, OpenAIBackend, ScriptedBackend

    sampling = {k: v for k, v in (("temperature", args.temperature), ("top_p", args.top_p)) if v is not None}
    check_backend_flags(args)
    if args.backend == "openai":
        if args.max_tokens is not None:
            sampling["max_tokens"] = args.max_tokens
        return OpenAIBackend(args.base_url, args.model, args.api_key, stream=not args.no_stream, **sampling)
    if args.backend == "local":
        return LocalBackend.load(
            args.checkpoint, device=args.device, max_tokens=args.max_tokens or 1024, **sampling
        )
    if reference is None:
        raise AgentError("--backend reference replays an environment's reference solution: give --env NAME")
    return ScriptedBackend(reference)


def _out_dir(given: str | None) -> Path:
    """The output directory, created before the episode runs so that one which cannot be written
    fails before any work; by default a new ``runs/agent/<time>`` (``-2``, ``-3``, ... when a run
    started in the same second has it)."""
    from dsv32.agent import AgentError

    try:
        if given is None:
            return _new_dir(Path("runs", "agent"), time.strftime("%Y%m%d-%H%M%S"))
        out = Path(given)
        out.mkdir(parents=True, exist_ok=True)
        if not os.access(out, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "permission denied")
        return out
    except OSError as err:
        where = given or "runs/agent"
        raise AgentError(f"cannot write the output directory {where}: {err.strerror or err}") from err


def _new_dir(parent: Path, name: str) -> Path:
    """``parent/name``, or ``name-2``, ``name-3``, ...: the first that did not exist, created (mkdir
    fails when another run made it first, so the directory is this run's alone)."""
    parent.mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        out = parent / (name if n == 1 else f"{name}-{n}")
        try:
            out.mkdir()
            return out
        except FileExistsError:
            n += 1


def _env_task(args: argparse.Namespace):
    from dsv32.agent import AgentError
    from dsv32.envs import get_env, resolve_tasks

    spec = get_env(args.env)
    tasks = resolve_tasks(args.env, args.tasks)
    if args.task_id is None:
        return spec, tasks[0]
    for task in tasks:
        if task.id == args.task_id:
            return spec, task
    raise AgentError(f"environment {args.env!r} has no task {args.task_id!r} in that task set")


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("agent", help="run an agent that thinks with tools (OpenAI-compatible or local model)")
    asub = p.add_subparsers(dest="agent_cmd", metavar="COMMAND", required=True)
    q = asub.add_parser(
        "run", help="one episode: stream reasoning, tool calls and results; write the trajectory"
    )
    add_backend(
        q,
        ("openai", "local", "reference"),
        default="openai",
        help="openai (with --base-url and --model), local CKPT (smollm2, a native V3.2 checkpoint, "
        "an HF dir), reference (with --env: replays the task's reference solution)",
    )
    q.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://localhost:8000/v1")
    q.add_argument("--model", help="model name at the endpoint")
    q.add_argument("--api-key", help="default: $OPENAI_API_KEY")
    q.add_argument("--no-stream", action="store_true", help="openai: wait for whole replies")
    q.add_argument("--task", help="the user's task")
    q.add_argument("--env", help="run a task of this environment (its tools and verifier)")
    q.add_argument("--tasks", help="the environment's task set name or a JSONL file (default: its first set)")
    q.add_argument("--task-id", help="which task (default: the first)")
    q.add_argument(
        "--tool", action="append", default=[], metavar="MODULE:FUNCTION", help="a Python function as a tool"
    )
    q.add_argument("--system", help="system prompt (with --task)")
    q.add_argument("--no-thinking", action="store_true", help="chat mode: no reasoning before the answer")
    q.add_argument("--max-steps", type=int, default=50)
    q.add_argument(
        "--context", default="none", help="none, summary, discard_75, discard_all, parallel_fewest_step"
    )
    q.add_argument("--context-window", type=int, help="the model's window in tokens")
    q.add_argument(
        "--trigger", type=float, default=0.8, help="fraction of the window that triggers --context"
    )
    q.add_argument("--parallel", type=int, default=4, help="trajectories of parallel_fewest_step")
    q.add_argument("--temperature", type=non_negative_float)
    q.add_argument("--top-p", type=probability)
    q.add_argument("--max-tokens", type=positive_int, help="per reply")
    q.add_argument("--tool-timeout", type=float, default=60.0, help="seconds per tool call")
    q.add_argument("--device", default="auto", help="--backend local: auto, cpu, cuda")
    q.add_argument("--out", help="output directory (default: a new runs/agent/<time>)")
    q.add_argument("--quiet", action="store_true", help="no streaming: summary and paths only")

    def run(args: argparse.Namespace) -> int:
        from dsv32.agent import Agent, AgentError, ScriptedBackend, run_episode

        if (args.task is None) == (args.env is None):
            raise AgentError("give exactly one of --task TEXT and --env NAME")
        if args.system and args.env:
            raise AgentError("--system goes with --task; an environment brings its own system prompt")
        options = dict(
            thinking=not args.no_thinking,
            max_steps=args.max_steps,
            context=args.context,
            context_window=args.context_window,
            context_trigger=args.trigger,
            parallel=args.parallel,
            tool_timeout_s=args.tool_timeout,
            on_event=None if args.quiet else Printer(),
        )
        tools = _load_tools(args.tool)
        if args.env and tools:
            raise AgentError("--tool goes with --task; an environment brings its own tools")
        Agent(ScriptedBackend([]), tools, system=args.system, **options)  # bad options fail before any work
        reward = None
        if args.env:
            spec, task = _env_task(args)
            env = spec.factory()
            try:
                reference = env.reference(task) if args.backend == "reference" else None
                backend = _backend(args, reference)
                out = _out_dir(args.out)
                trajectory, reward = run_episode(backend, env, task, **options)
            finally:
                env.close()
        else:
            backend = _backend(args, None)
            out = _out_dir(args.out)
            trajectory = Agent(backend, tools, system=args.system, **options).run(args.task)
        trajectory.save(out / "trajectory.json")
        trajectory.write_jsonl(out / "steps.jsonl")
        line = (
            f"stop: {trajectory.stop_reason}, steps: {trajectory.total_steps}, tokens: {trajectory.total_tokens}, "
            f"resets: {len(trajectory.context_events)}"
        )
        if reward is not None:
            line += f", reward: {reward.value:g} ({reward.reason})"
        if trajectory.error:
            line += f", error: {trajectory.error}"
        print(f"{line}\ntrajectory: {out / 'trajectory.json'}")
        return 0 if trajectory.stop_reason != "error" else 1

    command(q, run)
