"""HF decode per token at long context: transformers' DynamicCache against the engine's GrowingCache.

SmolLM2-135M-Instruct (the real small model, fp32), dense and with DSA attached (random indexers,
4 heads × 64, top-256, sparse mode). For each context length a random prompt is prefilled once per
cache, then ``--new-tokens`` greedy tokens are decoded one forward at a time; the time per decoded
token is the median step. DynamicCache concatenates all K/V every step, GrowingCache appends in place
(DSA's indexer keys grow in place with either): the tokens must be identical, the ratio is the cost of
the copies.

    python benchmarks/hf_decode.py [--contexts 1024 4096 7936] [--new-tokens 16] [--quick]

Writes runs/bench/hf_decode.json and hf_decode.png (same run, same machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from dsv32.dsa.hf import attach_dsa, detach_dsa
from dsv32.engine.backends import hf_cache_keyword
from dsv32.engine.hfcache import GrowingCache
from dsv32.engine.models import load_smollm2

CACHES = {"DynamicCache": lambda config: DynamicCache(config=config), "GrowingCache": GrowingCache}


def cache_bytes(cache) -> int:
    """Bytes the K/V of ``cache`` occupy (a GrowingLayer's whole buffers, headroom included)."""
    total = 0
    for layer in cache.layers:
        for name, grown in (("keys", "_keys"), ("values", "_values")):
            buffer = getattr(getattr(layer, grown, None), "buffer", None)
            tensor = buffer if buffer is not None else getattr(layer, name)
            total += tensor.numel() * tensor.element_size()
    return total


@torch.no_grad()
def decode(model, make_cache, prompt: torch.Tensor, new_tokens: int) -> dict:
    cache = make_cache(model.config)
    start = time.perf_counter()
    logits = model(prompt, **{hf_cache_keyword(model): cache}, use_cache=True, logits_to_keep=1).logits[:, -1]
    prefill_s = time.perf_counter() - start
    tokens, steps = [], []
    for _ in range(new_tokens):
        token = logits.argmax(-1)
        tokens.append(int(token))
        start = time.perf_counter()
        logits = model(token[:, None], **{hf_cache_keyword(model): cache}, use_cache=True).logits[:, -1]
        steps.append(time.perf_counter() - start)
    return {
        "prefill_s": prefill_s,
        "decode_ms_per_token": 1e3 * statistics.median(steps),
        "cache_mb": cache_bytes(cache) / 2**20,
        "tokens": tokens,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 7936])
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="contexts 512 and 2048, 4 decode steps")
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args(argv)
    if args.quick:
        args.contexts, args.new_tokens = [512, 2048], 4
    model, _ = load_smollm2()
    model.eval()
    rows = []
    for variant in ("dense", "DSA sparse"):
        if variant != "dense":
            attach_dsa(model, 4, 64, 256, mode="sparse")
        for context in args.contexts:
            prompt = torch.randint(
                100, model.config.vocab_size, (1, context), generator=torch.Generator().manual_seed(context)
            )
            row = {"model": variant, "context": context}
            for name, make_cache in CACHES.items():
                row[name] = decode(model, make_cache, prompt, args.new_tokens)
            row["same_tokens"] = row["DynamicCache"].pop("tokens") == row["GrowingCache"].pop("tokens")
            row["decode_speedup"] = (
                row["DynamicCache"]["decode_ms_per_token"] / row["GrowingCache"]["decode_ms_per_token"]
            )
            rows.append(row)
            print(json.dumps(row))
        if variant != "dense":
            detach_dsa(model)
    result = {
        "model": "SmolLM2-135M-Instruct",
        "dtype": "float32",
        "threads": torch.get_num_threads(),
        "new_tokens": args.new_tokens,
        "rows": rows,
        "all_same_tokens": all(r["same_tokens"] for r in rows),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "hf_decode.json").write_text(json.dumps(result, indent=2) + "\n")
    _plot(rows, out / "hf_decode.png")
    return 0 if result["all_same_tokens"] else 1


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for variant in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == variant]
        for name, style in (("DynamicCache", "--"), ("GrowingCache", "-")):
            ax.plot(
                [r["context"] for r in mine],
                [r[name]["decode_ms_per_token"] for r in mine],
                style, marker="o", label=f"{variant}, {name}",
            )  # fmt: skip
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("decode step (ms per token)")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.set_title("SmolLM2-135M decode on CPU: K/V appended in place")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
