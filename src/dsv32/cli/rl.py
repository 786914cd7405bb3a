"""``dsv32 rl train|eval``: GRPO post-training as in V3.2."""

from __future__ import annotations

import argparse

from dsv32.cli import command, flag_overrides, report_to_arg


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "rl", help="GRPO post-training as in V3.2 (unbiased KL, OPSM, Keep Routing/Sampling Mask)"
    )
    rsub = p.add_subparsers(dest="rl_cmd", metavar="COMMAND", required=True)
    helps = {
        "train": "rollouts → rewards → group advantages → mini-batch updates; metrics, plots, checkpoints",
        "eval": "greedy held-out accuracy of a policy on the recipe's eval problems",
    }

    def run(args: argparse.Namespace) -> int:
        from dsv32.rl import load_rl_config
        from dsv32.rl.grpo.single_turn import run_eval, train_grpo

        # eval has no --steps or --report-to
        keys = {"policy": "policy.name", "steps": "grpo.steps", "out": "out_dir", "report_to": "report_to"}
        cfg = load_rl_config(args.config, flag_overrides(args, keys))
        if args.rl_cmd == "eval":
            run_eval(cfg, progress=not args.no_progress)
            return 0
        result = train_grpo(cfg, resume=not args.no_resume, progress=not args.no_progress)
        from dsv32.distributed import is_main

        if is_main():  # under torchrun: once, not per rank
            print(result.summary())
        return 0

    for name, text in helps.items():
        q = rsub.add_parser(name, help=text)
        q.add_argument(
            "config", nargs="?", help="TOML recipe (configs/rl-*.toml); default: built-in defaults"
        )
        q.add_argument("--out", help="output directory (default: the recipe's out_dir)")
        q.add_argument("--policy", help="smollm2, tiny-llama, tiny-native, an HF dir or a native checkpoint")
        q.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
        q.add_argument("--no-progress", action="store_true")
        if name == "train":
            q.add_argument("--steps", type=int)
            q.add_argument("--no-resume", action="store_true", help="start over even if checkpoints exist")
            report_to_arg(q)
        command(q, run)
