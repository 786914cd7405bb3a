"""``dsv32 dsa warmup|sparse|eval`` and ``dsv32 demo``: train DeepSeek Sparse Attention into a model."""

from __future__ import annotations

import argparse

from dsv32.cli import command, report_to_arg


def recipe_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML recipe (see configs/); default: the built-in defaults")
    p.add_argument("--out", help="output directory")
    p.add_argument(
        "--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="override a field"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dsa", help="train DeepSeek Sparse Attention into a model (warm-up, sparse, eval)")
    dsub = p.add_subparsers(dest="dsa_cmd", metavar="COMMAND", required=True)
    helps = {
        "warmup": "dense warm-up: train only the indexers on Eq. 3 (paper lr 1e-3)",
        "sparse": "sparse stage: top-k attention, model on the LM loss, indexers on Eq. 4 (lr 7.3e-6)",
        "eval": "perplexity dense vs DSA, attention recall vs the oracle; Markdown report + plot",
    }

    def run(args: argparse.Namespace) -> int:
        from dsv32.train.dsa.pipeline import config_from_cli, run_eval, run_stage

        cfg, out = config_from_cli(args.dsa_cmd, vars(args))
        if args.dsa_cmd == "eval":
            run_eval(cfg, out, progress=not args.no_progress)
        else:
            from dsv32.distributed import is_main

            result = run_stage(
                cfg, args.dsa_cmd, out, progress=not args.no_progress, resume=not args.no_resume
            )
            if is_main():  # under torchrun: once, not per rank
                print(
                    f"dsv32 dsa {args.dsa_cmd}: {result.steps} steps → {result.model_dir or result.out_dir}"
                )
        return 0

    for name, text in helps.items():
        q = dsub.add_parser(name, help=text)
        recipe_args(q)
        q.add_argument(
            "--model", help="smollm2, an HF dir/hub id, a stage output (.../model), a native V3.2 checkpoint"
        )
        q.add_argument("--data", help="stdlib (default), a text or .jsonl file, or a directory")
        q.add_argument("--seq-len", type=int, help="tokens per sequence")
        q.add_argument("--topk", type=int, help="keys per query (DSA top-k)")
        if name != "eval":
            report_to_arg(q)
            q.add_argument("--steps", type=int)
            q.add_argument("--lr", type=float)
            q.add_argument(
                "--no-resume",
                action="store_true",
                help="start over, discarding the previous run in the output dir",
            )
        command(q, run)

    demo = sub.add_parser("demo", help="the main job: SmolLM2 → DSA → warm-up → sparse stage → eval report")
    recipe_args(demo)
    report_to_arg(demo)

    def run_demo(args: argparse.Namespace) -> int:
        from dsv32.train.dsa.pipeline import config_from_cli, run_demo

        cfg, _ = config_from_cli("demo", vars(args))
        run_demo(cfg, progress=not args.no_progress)
        return 0

    command(demo, run_demo)
