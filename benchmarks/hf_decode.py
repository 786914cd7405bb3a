"""HF decode per token at long context: transformers' DynamicCache against the engine's GrowingCache.

SmolLM2-135M-Instruct (the real small model, fp32), dense and with DSA attached (random indexers,
4 heads × 64, top-256, sparse mode). After a warm-up forward of each variant, for each context length
a random prompt is prefilled once into each cache (timed: ``prefill_s``), then the two caches decode
greedily one forward at a time, their steps interleaved (one untimed step each, then a step of one, a
step of the other, ... ``--new-tokens`` timed steps each). The time per decoded token is the median
step, with the steps' spread (``decode_ms``) and the spread of the ratio of adjacent steps
(``decode_speedup_per_step``); others' share of the machine meanwhile is recorded (``contention``,
see ``benchmarks/_timing.py``). DynamicCache concatenates all K/V every step, GrowingCache appends in
place (DSA's indexer keys grow in place with either): the tokens must be identical, the ratio is the
cost of the copies.

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
from _timing import (  # benchmarks/_timing.py, beside this script
    Meter,
    add_max_wait,
    interleaved,
    spread,
    wait_budget,
)
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


class Decoder:
    """A prompt prefilled into one cache, then greedy decoding one forward (one :meth:`step`) at a time."""

    def __init__(self, model, make_cache, prompt: torch.Tensor) -> None:
        self.model, self.cache, self.tokens = model, make_cache(model.config), []
        self.keyword = {hf_cache_keyword(model): self.cache}
        start = time.perf_counter()
        out = model(prompt, **self.keyword, use_cache=True, logits_to_keep=1)
        self.prefill_s = time.perf_counter() - start
        self.logits = out.logits[:, -1]

    def step(self) -> None:
        token = self.logits.argmax(-1)
        self.tokens.append(int(token))
        self.logits = self.model(token[:, None], **self.keyword, use_cache=True).logits[:, -1]


@torch.no_grad()
def compare(model, prompt: torch.Tensor, new_tokens: int, meter: Meter) -> dict:
    """Both caches on one prompt: a prefill each, then their decode steps interleaved (one step of
    each in turn, after one untimed step each), ``new_tokens`` timed steps per cache."""
    decoders = {name: Decoder(model, make, prompt) for name, make in CACHES.items()}
    runs = interleaved({name: d.step for name, d in decoders.items()}, new_tokens, meter)
    row = {}
    for name, d in decoders.items():
        steps = [1e3 * t for t in runs.seconds[name]]
        row[name] = {
            "prefill_s": d.prefill_s,
            "decode_ms_per_token": statistics.median(steps),
            "decode_ms": spread(steps),
            "cache_mb": cache_bytes(d.cache) / 2**20,
        }
    dynamic, growing = (runs.seconds[name] for name in CACHES)
    row["same_tokens"] = decoders["DynamicCache"].tokens == decoders["GrowingCache"].tokens
    row["decode_speedup"] = statistics.median(dynamic) / statistics.median(growing)
    row["decode_speedup_per_step"] = spread([a / b for a, b in zip(dynamic, growing)])
    row["contention"] = runs.contention()
    return row


@torch.no_grad()
def warm_up(model) -> None:
    """A short prefill and two decode steps, so the first measured forward pays no first-call costs."""
    prompt = torch.randint(100, model.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(1))
    decoder = Decoder(model, CACHES["DynamicCache"], prompt)
    decoder.step()
    decoder.step()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 7936])
    ap.add_argument("--new-tokens", type=int, default=16, help="timed decode steps per cache")
    ap.add_argument("--quick", action="store_true", help="contexts 512 and 2048, 6 decode steps")
    add_max_wait(ap)
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args(argv)
    if args.quick:
        args.contexts, args.new_tokens = [512, 2048], 6
    meter = Meter(max_wait=wait_budget(args))
    model, _ = load_smollm2()
    model.eval()
    rows = []
    for variant in ("dense", "DSA sparse"):
        if variant != "dense":
            attach_dsa(model, 4, 64, 256, mode="sparse")
        warm_up(model)
        for context in args.contexts:
            prompt = torch.randint(
                100, model.config.vocab_size, (1, context), generator=torch.Generator().manual_seed(context)
            )
            row = {"model": variant, "context": context, **compare(model, prompt, args.new_tokens, meter)}
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
        "measurement": meter.facts(),
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
