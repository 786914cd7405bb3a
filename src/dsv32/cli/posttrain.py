"""``dsv32 posttrain``: V3.2's post-training — cold-start data, specialist distillation, agentic GRPO
and the proof run; the work is in :mod:`dsv32.posttrain`."""

from __future__ import annotations

import argparse
import json

from dsv32.chat.templates import EPISODE_PROMPTS as PROMPTS
from dsv32.cli import command, non_negative_int, positive_int, report_to_arg


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
    q.add_argument("--prompt", default="reasoning_agent", choices=PROMPTS)
    q.add_argument("--workers", type=positive_int, default=4, help="episodes run at once (threads)")
    q.add_argument("--out", required=True, help="output JSONL of conversations")
    q.add_argument("--overwrite", action="store_true", help="replace --out if it exists")

    def run(args: argparse.Namespace) -> int:
        from dsv32.posttrain.data import cold_start

        report = cold_start(
            args.env, args.out, tasks=args.tasks, limit=args.limit, teacher=args.teacher, prompt=args.prompt,
            samples=args.samples, max_steps=args.max_steps, workers=args.workers, overwrite=args.overwrite,
        )  # fmt: skip
        print(json.dumps({"out": args.out, **report.to_dict()}))
        return 0

    command(q, run)


def add_distill(psub: argparse._SubParsersAction) -> None:
    q = psub.add_parser(
        "distill",
        help="specialists generate on their domains; verified, deduplicated, weighted union → SFT set",
    )
    q.add_argument("--specialist", action="append", default=[], metavar="DOMAIN=BACKEND", help="a domain "
                   "(an environment name) and its specialist (openai:MODEL@URL or local:NAME)")  # fmt: skip
    q.add_argument("--tasks", action="append", default=[], metavar="DOMAIN=SET_OR_JSONL",
                   help="the domain's tasks (default: its environment's first task set)")  # fmt: skip
    q.add_argument("--weight", action="append", default=[], metavar="DOMAIN=W", help="mix weight (default 1)")
    q.add_argument("--limit", type=positive_int, help="use the first N tasks of each domain")
    q.add_argument("--samples", type=positive_int, default=1, help="episodes per task")
    q.add_argument("--max-steps", type=positive_int, default=8)
    q.add_argument("--prompt", default="reasoning_agent", choices=PROMPTS)
    q.add_argument("--workers", type=positive_int, default=4)
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--out", required=True, help="output JSONL of conversations")
    q.add_argument("--overwrite", action="store_true", help="replace --out if it exists")

    def run(args: argparse.Namespace) -> int:
        from dsv32.posttrain.data import distill_set, specialists

        team = specialists(args.specialist, args.tasks, args.weight, args.limit)
        domains = distill_set(
            team, args.out, samples=args.samples, prompt=args.prompt, max_steps=args.max_steps,
            workers=args.workers, seed=args.seed, overwrite=args.overwrite,
        )  # fmt: skip
        print(json.dumps({"out": args.out, "domains": domains}))
        return 0

    command(q, run)


#: ``posttrain rl`` flags → the recipe keys they set (in an agentic GRPO recipe).
RL_FLAGS = {
    "policy": "policy.name",
    "steps": "grpo.steps",
    "prompts_per_step": "grpo.prompts_per_step",
    "group_size": "grpo.group_size",
    "eval_tasks": "agentic.eval_tasks",
    "report_to": "report_to",
    "out": "out_dir",
}


def add_rl(psub: argparse._SubParsersAction) -> None:
    q = psub.add_parser(
        "rl", help="mixed agentic GRPO: multi-turn episodes in environments (+ single-turn domains)"
    )
    q.add_argument("config", nargs="?", help="TOML recipe: an agentic GRPO recipe ([agentic], [[envs]] "
                   "and the rl sections) or the post-training recipe (configs/posttrain-smollm2.toml: its "
                   "[tasks] and [rl])")  # fmt: skip
    q.add_argument("--policy", help="a model that speaks V3.2 (an sft output dir, a native checkpoint)")
    q.add_argument("--out", help="output directory (default: the recipe's out_dir)")
    q.add_argument("--steps", type=positive_int)
    q.add_argument(
        "--prompts-per-step", type=positive_int, help="tasks drawn per step (grpo.prompts_per_step)"
    )
    q.add_argument("--group-size", type=positive_int, help="episodes per task, G (grpo.group_size; >= 2)")
    q.add_argument("--eval-tasks", type=non_negative_int,
                   help="held-out tasks per environment (agentic.eval_tasks; 0: none)")  # fmt: skip
    q.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    q.add_argument("--no-resume", action="store_true", help="start over even if checkpoints exist")
    q.add_argument("--no-progress", action="store_true")
    report_to_arg(q)

    def run(args: argparse.Namespace) -> int:
        from dsv32.posttrain.rl import run_rl

        run_rl(rl_recipe(args), resume=not args.no_resume, progress=not args.no_progress)
        return 0

    command(q, run)


def rl_recipe(args: argparse.Namespace):
    """The :class:`dsv32.posttrain.rl.RLRecipe` of ``posttrain rl``'s config, ``--set`` and flags."""
    from dsv32.posttrain.rl import read_rl_recipe

    given = {key: getattr(args, flag) for flag, key in RL_FLAGS.items() if getattr(args, flag) is not None}
    return read_rl_recipe(args.config, args.set, given)


def add_proof(psub: argparse._SubParsersAction) -> None:
    q = psub.add_parser(
        "proof",
        help="base → cold-start SFT → agentic GRPO on held-out code-interpreter tasks; report.{json,md,png}",
    )
    q.add_argument(
        "config", nargs="?", default=None, help="TOML recipe (default: configs/posttrain-smollm2.toml)"
    )
    q.add_argument("--out", help="output directory (default: the recipe's out_dir)")
    q.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    q.add_argument("--no-progress", action="store_true")
    report_to_arg(q)

    def run(args: argparse.Namespace) -> int:
        from dsv32.posttrain.pipeline import run_proof

        sets = [*args.set, *([f"report_to={args.report_to}"] if args.report_to is not None else [])]
        report = run_proof(args.config, sets, args.out, progress=not args.no_progress)
        print(json.dumps({k: v for k, v in report.items() if k != "details"}))
        return 0

    command(q, run)


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "posttrain",
        help="V3.2 post-training: cold-start data, specialist distillation, agentic GRPO, the proof",
    )
    psub = p.add_subparsers(dest="posttrain_cmd", metavar="COMMAND", required=True)
    add_cold_start(psub)
    add_distill(psub)
    add_rl(psub)
    add_proof(psub)
