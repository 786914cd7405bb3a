"""Whole-model prefill/decode throughput: DSA's sparse (gather) path vs the masked-dense reference.

A V3.2-shaped model at small width (V3.2 attention dims: 16 heads, qk 128+64, v 128, latent 512,
indexer 4×64) with a few layers, random weights. Both paths compute identical outputs; the
masked-dense one is what transformers runs (dense scores masked to the top-k: O(L²)).

A repetition is one prefill of ``--seq-len`` tokens into a fresh cache and ``--new-tokens`` decode
steps (``dsv32.engine.speed.measure_throughput``). After a short warm-up of each path, ``--reps``
repetitions run interleaved (gather, masked, gather, masked, ...); the tokens/s reported are medians
with their spread, the speed-ups ratios of the medians, and others' share of the machine meanwhile
is recorded (``contention``, see ``benchmarks/_timing.py``).

    python benchmarks/model_speed.py [--seq-len 8192] [--topk 512] [--new-tokens 16] [--reps 3] [--quick]

Writes runs/bench/model_speed.json and prints the ratios (same run, same machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from _timing import (  # benchmarks/_timing.py, beside this script
    Meter,
    add_max_wait,
    interleaved,
    spread,
    wait_budget,
)

from dsv32.engine.speed import measure_throughput
from dsv32.model import DeepseekV32, ModelConfig

IMPLS = ("gather", "masked")


def bench_config(topk: int, layers: int) -> ModelConfig:
    return ModelConfig(
        vocab_size=8192, hidden_size=1024, intermediate_size=2048, moe_intermediate_size=256,
        num_hidden_layers=layers, first_k_dense_replace=1, num_attention_heads=16, n_routed_experts=8,
        n_group=1, topk_group=1, num_experts_per_tok=2, q_lora_rank=384, kv_lora_rank=512,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, index_n_heads=4, index_head_dim=64,
        index_topk=topk, max_position_embeddings=163840,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--topk", type=int, default=512)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions; medians are reported")
    ap.add_argument("--quick", action="store_true", help="2048 tokens, 4 decode steps")
    add_max_wait(ap)
    ap.add_argument("--out", default="runs/bench", help="output directory")
    args = ap.parse_args(argv)
    if args.quick:
        args.seq_len, args.new_tokens = 2048, 4
    meter = Meter(max_wait=wait_budget(args))
    torch.manual_seed(0)
    model = DeepseekV32(bench_config(args.topk, args.layers)).eval()
    results = {
        "seq_len": args.seq_len,
        "topk": args.topk,
        "layers": args.layers,
        "threads": torch.get_num_threads(),
        "reps": args.reps,
    }

    def run(impl: str):
        def one() -> dict:
            model.set_dsa_mode("sparse", impl)
            return vars(measure_throughput(model, args.seq_len, args.new_tokens))

        return one

    for impl in IMPLS:  # warm-up
        model.set_dsa_mode("sparse", impl)
        measure_throughput(model, 256, 2)
    runs = interleaved({impl: run(impl) for impl in IMPLS}, args.reps, meter, warmup=False)
    for impl in IMPLS:
        values = runs.values[impl]
        results[impl] = {
            "prefill_tokens_per_s": statistics.median(v["prefill_tokens_per_s"] for v in values),
            "decode_tokens_per_s": statistics.median(v["decode_tokens_per_s"] for v in values),
            "prefill_tokens_per_s_spread": spread([v["prefill_tokens_per_s"] for v in values]),
            "decode_tokens_per_s_spread": spread([v["decode_tokens_per_s"] for v in values]),
            "repetitions": values,
        }
    g, m = results["gather"], results["masked"]
    results["prefill_speedup"] = g["prefill_tokens_per_s"] / m["prefill_tokens_per_s"]
    results["decode_speedup"] = g["decode_tokens_per_s"] / m["decode_tokens_per_s"]
    results["contention"] = runs.contention()
    results["measurement"] = meter.facts()
    print(
        f"{args.layers}-layer V3.2-shaped model, {args.seq_len} tokens, index_topk {args.topk}:\n"
        f"  sparse (gather):  prefill {g['prefill_tokens_per_s']:8.0f} tok/s  decode {g['decode_tokens_per_s']:7.2f} tok/s\n"
        f"  masked reference: prefill {m['prefill_tokens_per_s']:8.0f} tok/s  decode {m['decode_tokens_per_s']:7.2f} tok/s\n"
        f"  speedup: prefill {results['prefill_speedup']:.2f}x  decode {results['decode_speedup']:.2f}x "
        f"(medians of {args.reps} interleaved repetitions)"
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "model_speed.json").write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
