"""The ``dsv32`` command. Each subcommand is a thin wrapper over a library function.

Command groups are added by one ``_add_<group>`` function each; keep the work itself in the library.
"""

from __future__ import annotations

import argparse
import logging
import sys


def _add_model(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help="inspect model configs and checkpoints")
    msub = p.add_subparsers(dest="model_cmd", required=True)
    info = msub.add_parser("info", help="total and per-token-active parameter counts (meta device)")
    info.add_argument("config", help="config.json (HF or reference inference format) or a checkpoint dir")

    def run_info(args: argparse.Namespace) -> int:
        from dsv32.model import ModelConfig, describe_parameters

        print(describe_parameters(ModelConfig.from_pretrained(args.config)))
        return 0

    info.set_defaults(func=run_info)

    demo = msub.add_parser("demo", help="tiny random V3.2: save, reload, generate, time sparse vs masked")
    demo.add_argument("--out", default="runs/tiny-model", help="where to save the tiny checkpoint")
    demo.add_argument("--prompt-len", type=int, default=1024)
    demo.add_argument("--new-tokens", type=int, default=32)

    def run_demo(args: argparse.Namespace) -> int:
        from dsv32.engine.speed import run_tiny_demo

        run_tiny_demo(args.out, args.prompt_len, args.new_tokens)
        return 0

    demo.set_defaults(func=run_demo)


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate from a checkpoint directory (HF format)")
    p.add_argument("checkpoint")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="text (needs a tokenizer in the checkpoint directory)")
    src.add_argument("--prompt-ids", help="comma-separated token ids")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    p.add_argument("--seed", type=int, default=0)

    def run(args: argparse.Namespace) -> int:
        import torch

        from dsv32.engine import generate
        from dsv32.model import DeepseekV32

        model = DeepseekV32.from_pretrained(args.checkpoint, dtype=getattr(torch, args.dtype))
        tokenizer = None
        if args.prompt is not None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
            ids = tokenizer(args.prompt, add_special_tokens=True)["input_ids"]
        else:
            ids = [int(t) for t in args.prompt_ids.split(",")]
        out = generate(
            model,
            [ids],
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            generator=torch.Generator().manual_seed(args.seed),
        )
        new = out.tokens[0, : int(out.lengths[0])].tolist()
        print(tokenizer.decode(new) if tokenizer is not None else ",".join(map(str, new)))
        return 0

    p.set_defaults(func=run)


def _add_chat(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="the V3.2 conversation protocol: encode, parse, chat template")
    csub = p.add_subparsers(dest="chat_cmd", required=True)
    enc = csub.add_parser("encode", help="print the V3.2 prompt of a conversation JSON file")
    enc.add_argument("file", help='a JSON list of messages, or {"messages": [...], "tools": [...]}')
    enc.add_argument("--mode", choices=["thinking", "chat"], default="thinking")
    enc.add_argument("--no-bos", action="store_true", help="leave out <｜begin▁of▁sentence｜>")
    par = csub.add_parser("parse", help="parse a completion text file into an assistant message (JSON)")
    par.add_argument("file", help="exactly the generated text, up to and including the end token")
    par.add_argument("--mode", choices=["thinking", "chat"], default="thinking")
    par.add_argument("--lenient", action="store_true", help="recover what is possible; list problems")
    csub.add_parser("template", help="print the V3.2 Jinja chat_template (for transformers / vLLM)")

    def run(args: argparse.Namespace) -> int:
        import json

        from dsv32 import chat

        try:
            if args.chat_cmd == "encode":
                with open(args.file, encoding="utf-8") as f:
                    messages = chat.conversation_from_json(json.load(f))
                print(chat.encode_messages(messages, args.mode, add_bos=not args.no_bos))
            elif args.chat_cmd == "parse":
                with open(args.file, encoding="utf-8", newline="") as f:
                    text = f.read()
                message = chat.parse_completion(text, args.mode, strict=not args.lenient)
                print(json.dumps(message, ensure_ascii=False, indent=2))
            else:
                sys.stdout.write(chat.chat_template())
        except (OSError, ValueError) as err:  # ConversationError, ParseError, bad JSON are ValueErrors
            print(f"dsv32 chat {args.chat_cmd}: {err}", file=sys.stderr)
            return 1
        return 0

    p.set_defaults(func=run)


def _recipe_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML recipe (see configs/); default: the built-in defaults")
    p.add_argument("--out", help="output directory")
    p.add_argument(
        "--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="override a field"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _add_dsa(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dsa", help="train DeepSeek Sparse Attention into a model (warm-up, sparse, eval)")
    dsub = p.add_subparsers(dest="dsa_cmd", required=True)
    helps = {
        "warmup": "dense warm-up: train only the indexers on Eq. 3 (paper lr 1e-3)",
        "sparse": "sparse stage: top-k attention, model on the LM loss, indexers on Eq. 4 (lr 7.3e-6)",
        "eval": "perplexity dense vs DSA, attention recall vs the oracle; Markdown report + plot",
    }
    for name, text in helps.items():
        q = dsub.add_parser(name, help=text)
        _recipe_args(q)
        q.add_argument("--model", help="smollm2, an HF dir/hub id, a stage output (.../model), tiny-llama")
        q.add_argument("--data", help="stdlib (default), a text or .jsonl file, or a directory")
        q.add_argument("--seq-len", type=int, help="tokens per sequence")
        q.add_argument("--topk", type=int, help="keys per query (DSA top-k)")
        if name != "eval":
            q.add_argument("--steps", type=int)
            q.add_argument("--lr", type=float)

    def run(args: argparse.Namespace) -> int:
        from dsv32.train import ConfigError
        from dsv32.train.pipeline import config_from_cli, run_eval, run_stage

        try:
            cfg, out = config_from_cli(args.dsa_cmd, vars(args))
            if args.dsa_cmd == "eval":
                run_eval(cfg, out, progress=not args.no_progress)
            else:
                result = run_stage(cfg, args.dsa_cmd, out, progress=not args.no_progress)
                print(
                    f"dsv32 dsa {args.dsa_cmd}: {result.steps} steps → {result.model_dir or result.out_dir}"
                )
        except (ConfigError, OSError) as err:
            print(f"dsv32 dsa {args.dsa_cmd}: {err}", file=sys.stderr)
            return 1
        return 0

    p.set_defaults(func=run)


def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="the main job: SmolLM2 → DSA → warm-up → sparse stage → eval report")
    _recipe_args(p)

    def run(args: argparse.Namespace) -> int:
        from dsv32.train import ConfigError
        from dsv32.train.pipeline import config_from_cli, run_demo

        try:
            cfg, _ = config_from_cli("demo", vars(args))
            run_demo(cfg, progress=not args.no_progress)
        except (ConfigError, OSError) as err:
            print(f"dsv32 demo: {err}", file=sys.stderr)
            return 1
        return 0

    p.set_defaults(func=run)


def _add_rl(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "rl", help="GRPO post-training as in V3.2 (unbiased KL, OPSM, Keep Routing/Sampling Mask)"
    )
    rsub = p.add_subparsers(dest="rl_cmd", required=True)
    helps = {
        "train": "rollouts → rewards → group advantages → mini-batch updates; metrics, plots, checkpoints",
        "eval": "greedy held-out accuracy of a policy on the recipe's eval problems",
    }
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

    def run(args: argparse.Namespace) -> int:
        from dsv32.rl import RLConfigError, load_rl_config
        from dsv32.rl.trainer import run_eval, train_grpo

        overrides = list(args.set)
        if args.policy:
            overrides.append(f"policy.name={args.policy}")
        if getattr(args, "steps", None):
            overrides.append(f"grpo.steps={args.steps}")
        if args.out:
            overrides.append(f"out_dir={args.out}")
        try:
            cfg = load_rl_config(args.config, overrides)
            if args.rl_cmd == "eval":
                run_eval(cfg, progress=not args.no_progress)
                return 0
            result = train_grpo(cfg, resume=not args.no_resume, progress=not args.no_progress)
        except (RLConfigError, OSError, ValueError) as err:
            print(f"dsv32 rl {args.rl_cmd}: {err}", file=sys.stderr)
            return 1
        print(result.summary())
        return 0

    p.set_defaults(func=run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dsv32", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_model(sub)
    _add_generate(sub)
    _add_chat(sub)
    _add_dsa(sub)
    _add_rl(sub)
    _add_demo(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
