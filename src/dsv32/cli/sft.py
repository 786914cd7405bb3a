"""``dsv32 sft [RECIPE]``: supervised fine-tuning on conversations, loss on assistant tokens only."""

from __future__ import annotations

import argparse

from dsv32.cli import command, flag_overrides, positive_int, report_to_arg


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sft",
        help="supervised fine-tuning on JSONL conversations (loss on assistant tokens; V3.2 tokens added)",
    )
    p.add_argument("config", nargs="?", help="TOML recipe (configs/sft-*.toml); default: built-in defaults")
    p.add_argument("--data", help="JSONL conversations (data.path)")
    p.add_argument("--eval-data", help="held-out JSONL conversations for an eval loss (data.eval_path)")
    p.add_argument("--model", help="smollm2, tiny-llama, tiny-native, an HF dir or a native checkpoint")
    p.add_argument("--out", help="output directory (default: the recipe's out_dir)")
    p.add_argument("--steps", type=positive_int, help="optimizer steps (default: from train.epochs)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    p.add_argument("--no-resume", action="store_true", help="start over even if checkpoints exist")
    p.add_argument("--no-progress", action="store_true")
    report_to_arg(p)

    def run(args: argparse.Namespace) -> int:
        from dsv32.train.sft import load_sft_config, train_sft

        keys = {"data": "data.path", "eval_data": "data.eval_path", "model": "model.name", "steps": "train.steps",
                "out": "out_dir", "report_to": "report_to"}  # fmt: skip
        cfg = load_sft_config(args.config, flag_overrides(args, keys))
        from dsv32.distributed import is_main

        result = train_sft(cfg, resume=not args.no_resume, progress=not args.no_progress)
        if is_main():  # under torchrun: once, not per rank
            print(result.summary())
        return 0

    command(p, run)
