"""``dsv32 model info|demo`` and ``dsv32 generate``."""

from __future__ import annotations

import argparse

from dsv32.cli import command, non_negative_float, non_negative_int, positive_int, probability


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help="inspect model configs and checkpoints")
    msub = p.add_subparsers(dest="model_cmd", metavar="COMMAND", required=True)
    info = msub.add_parser("info", help="total and per-token-active parameter counts (meta device)")
    info.add_argument("config", help="config.json (HF or reference inference format) or a checkpoint dir")

    def run_info(args: argparse.Namespace) -> int:
        from dsv32.model import ModelConfig, describe_parameters

        print(describe_parameters(ModelConfig.from_pretrained(args.config)))
        return 0

    command(info, run_info)

    demo = msub.add_parser("demo", help="tiny random V3.2: save, reload, generate, time sparse vs masked")
    demo.add_argument("--out", default="runs/tiny-model", help="where to save the tiny checkpoint")
    demo.add_argument("--prompt-len", type=positive_int, default=1024)
    demo.add_argument("--new-tokens", type=positive_int, default=32)

    def run_demo(args: argparse.Namespace) -> int:
        from dsv32.engine.speed import run_tiny_demo

        run_tiny_demo(args.out, args.prompt_len, args.new_tokens)
        return 0

    command(demo, run_demo)
    _add_generate(sub)


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate from a V3.2 checkpoint directory")
    p.add_argument("checkpoint")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="text (needs a tokenizer in the checkpoint directory)")
    src.add_argument("--prompt-ids", help="comma-separated token ids")
    p.add_argument("--max-new-tokens", type=positive_int, default=64)
    p.add_argument("--temperature", type=non_negative_float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=probability, default=1.0)
    p.add_argument("--top-k", type=non_negative_int, default=0)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    p.add_argument("--seed", type=int, default=0)

    def run(args: argparse.Namespace) -> int:
        import torch

        from dsv32.engine import generate
        from dsv32.model import DeepseekV32, ModelConfig

        # The cheap checks before the weights load: the checkpoint's config, then the tokenizer.
        ModelConfig.from_pretrained(args.checkpoint)
        tokenizer = None
        if args.prompt is not None:
            from transformers import AutoTokenizer

            from dsv32.errors import DSV32Error

            try:
                tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
            except (OSError, ValueError) as err:
                raise DSV32Error(
                    f"{args.checkpoint} holds no tokenizer for --prompt ({str(err).splitlines()[0]}); "
                    "save one beside the weights, or give --prompt-ids"
                ) from None
        model = DeepseekV32.from_pretrained(args.checkpoint, dtype=getattr(torch, args.dtype))
        if tokenizer is not None:
            ids = tokenizer(args.prompt, add_special_tokens=True)["input_ids"]
        else:
            ids = _token_ids(args.prompt_ids, model.config.vocab_size)
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

    command(p, run)


def _token_ids(text: str, vocab_size: int) -> list[int]:
    from dsv32.errors import DSV32Error

    try:
        ids = [int(t) for t in text.split(",")]
    except ValueError:
        raise DSV32Error(f"--prompt-ids {text!r}: expected comma-separated integers, e.g. 1,2,3") from None
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise DSV32Error(f"--prompt-ids: {bad[:3]} outside the model's vocabulary [0, {vocab_size})")
    return ids
