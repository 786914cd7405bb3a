"""``dsv32 serve MODEL``: an OpenAI-compatible server (chat completions with reasoning and tool calls)."""

from __future__ import annotations

import argparse

from dsv32.cli import command, non_negative_int, number_type, positive_int

port_number = number_type(int, lambda v: 0 <= v <= 65535, "a port number in [0, 65535]")


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="OpenAI-compatible HTTP server over a local model (reasoning_content, tool_calls, streaming)",
    )
    p.add_argument(
        "model", help="a native V3.2 checkpoint, an HF model directory, smollm2, tiny-*, or a DSA stage"
    )
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: loopback only)")
    p.add_argument("--port", type=port_number, default=8000)
    p.add_argument(
        "--max-batch", type=positive_int, default=8, help="rows decoded together (continuous batching)"
    )
    p.add_argument(
        "--max-queue", type=positive_int, default=64, help="requests that may wait for a slot; more get 503"
    )
    p.add_argument(
        "--max-model-len", type=positive_int, help="prompt + completion tokens (default: the model's)"
    )
    p.add_argument(
        "--tool-call-parser",
        choices=["auto", "hermes", "llama3_json", "mistral"],
        default="auto",
        help="how a chat-template model writes tool calls: hermes <tool_call>{json}</tool_call> (Qwen, "
        "Hermes, SmolLM), llama3_json, mistral [TOOL_CALLS] (default auto: by the template's family; "
        "a V3.2-format model always writes DSML)",
    )
    p.add_argument(
        "--max-tokens-default",
        type=positive_int,
        help="max_tokens of a chat request that gives none (default: the rest of the window, as vLLM; "
        "a chatty model may then generate for minutes)",
    )
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1 endpoints")
    p.add_argument(
        "--enable-rl-routes",
        action="store_true",
        help="serve the RL routes that pause the server and load weights (/pause, /resume, "
        "/update_weights, /init_weight_transfer_engine): a rollout engine for dsv32 rl train and "
        "posttrain rl; off by default (404)",
    )
    p.add_argument("--served-model-name", help="the model id clients pass (default: MODEL)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16"],
        default="auto",
        help="weights and activations (matmuls accumulate in fp32; log-probs are computed in fp32): "
        "auto is bfloat16 on a GPU or CPU with native bf16 (AVX512-BF16, AMX), else float32; with "
        "--enable-rl-routes auto is float32, the trainer's dtype, so that samples stay on policy",
    )
    p.add_argument(
        "--prefix-cache-mb",
        type=non_negative_int,
        default=1024,
        help="memory for KV entries kept across requests (automatic prefix caching: a prompt that "
        "begins as an earlier prompt or conversation runs only its new tokens; least recently used "
        "entries are evicted; 0 turns it off; default 1024)",
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        help="torch CPU threads (default: torch's; 1 is faster on a busy machine)",
    )

    def run(args: argparse.Namespace) -> int:
        import sys

        from dsv32.serve import check_listen, create_app, load_served, serve_forever
        from dsv32.serve.server import exposure_warning

        check_listen(args.host, args.port)  # before the model loads: fail in a second
        warning = exposure_warning(args.host, args.api_key, args.enable_rl_routes)
        if warning:
            print(f"dsv32 serve: {warning}", file=sys.stderr, flush=True)
        if args.threads is not None:
            import torch

            torch.set_num_threads(args.threads)
        served = load_served(
            args.model,
            device=args.device,
            max_model_len=args.max_model_len,
            tool_call_parser=args.tool_call_parser,
            dtype=serve_dtype(args.dtype, args.enable_rl_routes),
        )
        if args.served_model_name:
            served.name = args.served_model_name
        app = create_app(
            served,
            max_batch=args.max_batch,
            max_queue=args.max_queue,
            api_key=args.api_key,
            max_tokens_default=args.max_tokens_default,
            rl_routes=args.enable_rl_routes,
            prefix_cache_bytes=args.prefix_cache_mb * 2**20,
        )
        rl = ", RL routes on" if args.enable_rl_routes else ""
        print(
            f"dsv32 serve: {served.name} ({served.prompt_format}) on http://{args.host}:{args.port}/v1{rl}; "
            f"{served.dtype}",
            flush=True,
        )
        serve_forever(app, args.host, args.port)
        return 0

    command(p, run)


def serve_dtype(dtype: str, rl_routes: bool) -> str:
    """``--dtype``: ``auto`` as a rollout engine (RL routes on) is ``float32``, the trainer's dtype
    (bf16 sampling against an fp32 trainer is off policy by ~2 % a token: docs/rl.md); an explicit
    choice is kept."""
    return "float32" if dtype == "auto" and rl_routes else dtype
