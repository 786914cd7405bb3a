"""``dsv32 envs list|show|run|serve|build-swe``: the verifiable environments and their task sets.

``run`` plays tasks of an environment with a backend through :func:`dsv32.agent.run_episode` and
prints one line per task, then the summary as JSON; with ``--out DIR`` it writes ``summary.json``,
``results.jsonl`` (one row per task: id, reward, components, reason, steps, stop reason, seconds)
and ``trajectories/<id>.json``. Backends: ``reference`` (each task's reference solution, replayed
through the same tools and verifier: every shipped environment must score 1.0), ``scripted``
(``--script FILE``: a JSON list of assistant messages, the same for every task), ``openai``
(``--base-url``, ``--model``) and ``local CKPT`` (``--backend local smollm2``, a native V3.2
checkpoint or a Hugging Face model directory). ``--parallel K`` runs K episodes at once, each with
its own environment (the local backend runs one at a time: it holds one model).

``serve`` puts an environment behind OpenEnv's HTTP/WebSocket protocol
(:func:`dsv32.interop.openenv.build_app`; extra ``openenv``): one sandboxed environment per
WebSocket session, at most ``--max-sessions`` at once, on ``--host`` (127.0.0.1 by default).

``build-swe`` mines code-repository tasks from a PyPI package's sdist
(:func:`dsv32.envs.swe.build_swe_tasks`) into a JSONL file that ``run swe --tasks FILE`` plays.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dsv32.cli import add_backend, check_backend_flags, command, number_type, positive_float, positive_int
from dsv32.errors import DSV32Error

BACKENDS = ("reference", "scripted", "openai", "local")
port_number = number_type(int, lambda v: 1 <= v <= 65535, "a port number (1 to 65535)")


class EnvsCliError(DSV32Error, ValueError):
    """A bad ``dsv32 envs`` request (a missing option for the chosen backend, a bad script file)."""


def _episode(spec, task, make_backend: Callable, agent_options: dict, out: Path | None) -> dict:
    from dsv32.agent import run_episode

    env = spec.factory()
    start = time.perf_counter()
    try:
        trajectory, reward = run_episode(make_backend(env, task), env, task, **agent_options)
    finally:
        env.close()
    if out is not None:
        trajectory.save(out / "trajectories" / f"{task.id}.json")
    return {
        "id": task.id,
        "reward": reward.value,
        "components": reward.components,
        "reason": reward.reason,
        "steps": len(trajectory.steps),
        "stop_reason": trajectory.stop_reason,
        "seconds": round(time.perf_counter() - start, 3),
    }


def run_tasks(
    env_name: str,
    tasks: list,
    make_backend: Callable,
    *,
    parallel: int = 1,
    out: str | Path | None = None,
    agent_options: dict | None = None,
    on_result: Callable[[dict], None] | None = None,
) -> dict:
    """Run every task (``make_backend(env, task)`` gives each episode its backend) and summarize:
    ``mean_reward``, ``episodes_per_minute`` (wall clock), per-task ``results``."""
    from dsv32.envs import get_env

    spec = get_env(env_name)
    out = Path(out) if out is not None else None
    if out is not None:
        (out / "trajectories").mkdir(parents=True, exist_ok=True)
    options = {"max_steps": 40, **(agent_options or {})}
    start = time.perf_counter()
    results = []
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        futures = [pool.submit(_episode, spec, t, make_backend, options, out) for t in tasks]
        for future in futures:
            results.append(future.result())
            if on_result is not None:
                on_result(results[-1])
    wall = time.perf_counter() - start
    summary = {
        "env": env_name,
        "n": len(results),
        "mean_reward": sum(r["reward"] for r in results) / max(1, len(results)),
        "parallel": parallel,
        "wall_s": round(wall, 3),
        "episodes_per_minute": round(60 * len(results) / wall, 2) if wall > 0 else None,
        "results": results,
    }
    if out is not None:
        (out / "summary.json").write_text(
            json.dumps({k: v for k, v in summary.items() if k != "results"}, indent=1)
        )
        with (out / "results.jsonl").open("w") as f:
            f.writelines(json.dumps(r) + "\n" for r in results)
    return summary


def backend_factory(args: argparse.Namespace) -> Callable:
    """``make_backend(env, task)`` for the chosen ``--backend``."""
    from dsv32.agent import LocalBackend, OpenAIBackend, ScriptedBackend

    check_backend_flags(args)
    if args.backend == "reference":
        return lambda env, task: ScriptedBackend(env.reference(task))
    if args.backend == "scripted":
        if not args.script:
            raise EnvsCliError("--backend scripted needs --script FILE (a JSON list of assistant messages)")
        replies = json.loads(Path(args.script).read_text(encoding="utf-8"))
        if not isinstance(replies, list) or not all(isinstance(r, dict) for r in replies):
            raise EnvsCliError(f"{args.script}: a script is a JSON list of assistant message objects")
        return lambda env, task: ScriptedBackend(replies)
    if args.backend == "openai":
        return lambda env, task: OpenAIBackend(args.base_url, args.model, max_tokens=args.max_new_tokens)
    backend = LocalBackend.load(args.checkpoint, max_new_tokens=args.max_new_tokens, seed=0)
    return lambda env, task: backend


def _list(args: argparse.Namespace) -> int:
    from dsv32.envs import registry

    for name, spec in sorted(registry().items()):
        print(f"{name:20s} {spec.description}\n{'':20s} task sets: {', '.join(spec.task_sets) or '-'}")
    return 0


def _show(args: argparse.Namespace) -> int:
    from dsv32.envs import get_env, resolve_tasks
    from dsv32.envs.sandbox import isolation

    spec = get_env(args.name)
    tasks = resolve_tasks(args.name, args.tasks)
    env = spec.factory()
    try:
        messages = env.reset(tasks[0])
        tools = [t["function"]["name"] for t in env.tools()]
    finally:
        env.close()
    print(f"{spec.name}: {spec.description}")
    print(
        f"task sets: {', '.join(spec.task_sets) or '-'} ({len(tasks)} tasks in {args.tasks or 'the first'})"
    )
    print(f"tools: {', '.join(tools)}")
    print(f"sandbox: {isolation().note}")
    print(
        f"example task {tasks[0].id}:\n  system: {messages[0]['content']}\n  user: {messages[-1]['content']}"
    )
    return 0


def _run(args: argparse.Namespace) -> int:
    from dsv32.envs import resolve_tasks

    tasks = resolve_tasks(args.name, args.tasks)[: args.n]
    make_backend = backend_factory(args)
    parallel = 1 if args.backend == "local" else args.parallel

    def show(r: dict) -> None:
        print(
            f"{r['id']}: reward {r['reward']:.2f} ({r['steps']} steps, {r['stop_reason']}) {r['reason'][:100]}"
        )

    summary = run_tasks(
        args.name, tasks, make_backend, parallel=parallel, out=args.out,
        agent_options={"max_steps": args.max_steps}, on_result=show,
    )  # fmt: skip
    summary["backend"] = args.backend
    print(json.dumps({k: v for k, v in summary.items() if k != "results"}))
    return 0


def _options(pairs: list[str]) -> dict:
    """``KEY=VALUE`` pairs as factory keywords; a VALUE that is JSON is read as JSON, else as text."""
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise EnvsCliError(f"--option {pair!r}: expected KEY=VALUE, e.g. --option cell_timeout_s=10")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def _serve(args: argparse.Namespace) -> int:
    from dsv32.envs import get_env

    get_env(args.name)  # an unknown environment is named before the optional library is needed
    options = _options(args.option)
    from dsv32.interop.openenv import build_app, serve

    app = build_app(
        args.name, tasks=args.tasks, max_sessions=args.max_sessions, options=options,
        session_timeout_s=args.session_timeout,
    )  # fmt: skip
    catalog = app.state.catalog
    print(
        f"serving {args.name} ({len(catalog.tasks)} tasks of {catalog.task_set}) over OpenEnv on "
        f"http://{args.host}:{args.port} (WebSocket sessions at /ws, at most {args.max_sessions}; schemas at "
        "/schema, docs at /docs)",
        flush=True,
    )
    serve(app, args.host, args.port)
    return 0


def _build_swe(args: argparse.Namespace) -> int:
    from dsv32.envs.swe import build_swe_tasks

    start = time.perf_counter()
    path = build_swe_tasks(args.package, args.n, Path(args.out), seed=args.seed)
    with path.open(encoding="utf-8") as f:
        kept = sum(1 for line in f if line.strip())
    print(f"{kept} tasks from {args.package} in {time.perf_counter() - start:.0f} s: {path}")
    print(f"play them: dsv32 envs run swe --tasks {path}")
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("envs", help="verifiable environments: list, show, run an agent on their tasks")
    esub = p.add_subparsers(dest="envs_cmd", metavar="COMMAND", required=True)
    command(esub.add_parser("list", help="the registered environments and their task sets"), _list)
    show = esub.add_parser("show", help="an environment's tools, task sets, sandbox and an example task")
    show.add_argument("name")
    show.add_argument("--tasks", help="a task set name or a JSONL file (default: the first set)")
    command(show, _show)
    run = esub.add_parser("run", help="run a backend on tasks; print and write rewards as JSON")
    run.add_argument("name")
    add_backend(
        run,
        BACKENDS,
        default="reference",
        before="environment name",
        help="reference (each task's reference solution: must score 1.0), scripted (with --script), "
        "openai (with --base-url and --model), local CKPT (smollm2, a native V3.2 checkpoint, an HF dir)",
    )
    run.add_argument("--tasks", help="a task set name or a JSONL file (default: the first set)")
    run.add_argument("--n", type=positive_int, default=20, help="run the first N tasks (default 20)")
    run.add_argument("--out", help="write summary.json, results.jsonl and trajectories/ here")
    run.add_argument("--parallel", type=positive_int, default=1, help="episodes at once (default 1)")
    run.add_argument("--max-steps", type=int, default=40, help="model turns per episode (default 40)")
    run.add_argument("--script", help="scripted backend: a JSON list of assistant messages")
    run.add_argument("--base-url", help="openai backend: the server's /v1 URL")
    run.add_argument("--model", help="openai backend: the served model name")
    run.add_argument(
        "--max-new-tokens", type=positive_int, default=512, help="openai/local: tokens per reply"
    )
    command(run, _run)
    srv = esub.add_parser("serve", help="serve an environment over OpenEnv's HTTP/WebSocket protocol")
    srv.add_argument("name")
    srv.add_argument("--port", type=port_number, default=8000, help="port to listen on (default 8000)")
    srv.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    srv.add_argument(
        "--max-sessions", type=positive_int, default=4, help="WebSocket sessions at once (default 4)"
    )
    srv.add_argument("--tasks", help="a task set name or a JSONL file (default: the first set)")
    srv.add_argument(
        "--session-timeout",
        type=positive_float,
        help="close a session idle this many seconds (default: never)",
    )
    srv.add_argument(
        "--option", action="append", default=[], metavar="KEY=VALUE",
        help="an option of the environment (repeatable; VALUE read as JSON when it is JSON)",
    )  # fmt: skip
    command(srv, _serve)
    build = esub.add_parser("build-swe", help="mine code-repository tasks from a PyPI package's sdist")
    build.add_argument("--package", required=True, help="NAME==VERSION, e.g. inflection==0.5.1")
    build.add_argument("--n", type=positive_int, default=50, help="tasks to keep at most (default 50)")
    build.add_argument("--out", required=True, help="a .jsonl file, or a folder for NAME-VERSION.jsonl")
    build.add_argument("--seed", type=int, default=0, help="order of the mutants tried (default 0)")
    command(build, _build_swe)
