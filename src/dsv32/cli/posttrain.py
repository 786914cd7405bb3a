"""``dsv32 posttrain cold-start``: the data steps of V3.2's post-training pipeline (cold-start
conversations from verified trajectories)."""

from __future__ import annotations

import argparse
import json

from dsv32.cli import command, positive_int


def _tasks(env: str, tasks: str | None, limit: int | None):
    from dsv32.envs.base import resolve_tasks

    rows = resolve_tasks(env, tasks)
    return rows[:limit] if limit else rows


def add_cold_start(psub: argparse._SubParsersAction) -> None:
    q = psub.add_parser(
        "cold-start",
        help="verified thinking-with-tools conversations from reference solutions or a teacher (JSONL for sft)",
    )
    q.add_argument("--env", required=True, help="environment name (dsv32 envs list), e.g. code-interpreter")
    q.add_argument(
        "--tasks", help="the environment's task set name or a tasks JSONL file (default: its first set)"
    )
    q.add_argument("--limit", type=positive_int, help="use the first N tasks")
    q.add_argument(
        "--teacher", help="backend spec (openai:MODEL@URL or local:NAME); default: reference solutions"
    )
    q.add_argument("--samples", type=positive_int, default=1, help="teacher episodes per task")
    q.add_argument("--max-steps", type=positive_int, default=8, help="model calls per teacher episode")
    q.add_argument("--prompt", default="reasoning_agent", choices=("reasoning_agent", "agent", "env", "bare"))
    q.add_argument("--workers", type=positive_int, default=4, help="episodes run at once (threads)")
    q.add_argument("--out", required=True, help="output JSONL of conversations")

    def run(args: argparse.Namespace) -> int:
        from dsv32.envs.base import get_env
        from dsv32.synth.backends import parse_spec
        from dsv32.synth.coldstart import build_coldstart

        spec = get_env(args.env)
        teacher = parse_spec(args.teacher) if args.teacher else None
        tasks = _tasks(args.env, args.tasks, args.limit)
        report = build_coldstart(
            spec.factory, tasks, args.out, prompt=args.prompt, teacher=teacher, samples=args.samples,
            max_steps=args.max_steps, workers=args.workers,
        )  # fmt: skip
        print(json.dumps({"out": args.out, **report.to_dict()}))
        return 0

    command(q, run)


def add_rl(psub: argparse._SubParsersAction) -> None:
    q = psub.add_parser(
        "rl", help="mixed agentic GRPO: multi-turn episodes in environments (+ single-turn domains)"
    )
    q.add_argument("config", nargs="?", help="TOML recipe ([agentic], [[envs]] and the rl sections)")
    q.add_argument("--policy", help="a model that speaks V3.2 (an sft output dir, a native checkpoint)")
    q.add_argument("--out", help="output directory (default: the recipe's out_dir)")
    q.add_argument("--steps", type=positive_int)
    q.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    q.add_argument("--no-resume", action="store_true", help="start over even if checkpoints exist")
    q.add_argument("--no-progress", action="store_true")

    def run(args: argparse.Namespace) -> int:
        from dsv32.rl.agentic_config import load_agentic_config
        from dsv32.rl.agentic_trainer import train_agentic, v32_policy

        overrides = list(args.set)
        for flag, key in (("policy", "policy.name"), ("steps", "grpo.steps"), ("out", "out_dir")):
            if getattr(args, flag):
                overrides.append(f"{key}={getattr(args, flag)}")
        cfg = load_agentic_config(args.config, overrides)
        policy = v32_policy(cfg)
        result = train_agentic(cfg, policy=policy, resume=not args.no_resume, progress=not args.no_progress)
        print(result.summary())
        return 0

    command(q, run)


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("posttrain", help="V3.2 post-training: cold-start data, agentic GRPO")
    psub = p.add_subparsers(dest="posttrain_cmd", required=True)
    add_cold_start(psub)
    add_rl(psub)
