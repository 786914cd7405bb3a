"""DSA's sparse attention in the GQA layout of Hugging Face models (SmolLM2-135M's shapes by default):
the C kernel against the torch gather path and dense attention, on the CPU.

    python benchmarks/attention_gqa.py [--topk 256] [--heads 9 --kv-heads 3 --head-dim 64] [--quick]

- prefill over L = ratio · k tokens, the selection given (the indexer is the same for every path):
  ``masked_dense`` (SDPA over all keys with the boolean selection mask, what ``prefer_dense`` picks
  below the crossover), ``kernel`` (``dsv32.dsa.sparse_attention`` on the C kernel) and ``torch``
  (the same call with the C kernels off). ``crossover_ratio``: the L/k from which the kernel beats
  masked-dense (what ``GQA_KERNEL_CROSSOVER_RATIO`` is set from).
- decode, one query against a cache ``[1, H_kv, capacity, D]`` of L tokens (the strided view an HF
  cache hands the layer): ``sdpa`` over all L keys (a dense model's step), ``kernel`` and ``torch`` over
  the top-k.

Repetitions are interleaved (after one warm-up call of each path) and each number is a median of the
same run; others' share of the machine during each row's repetitions is recorded with it
(``contention``, see ``benchmarks/_timing.py``; ``--max-wait``). Writes
runs/bench/attention_gqa.json and attention_gqa.png.
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from _timing import Meter, add_max_wait, interleaved, wait_budget  # benchmarks/_timing.py, beside this script
from attention import crossover_point  # benchmarks/attention.py, beside this script

from dsv32.dsa import DENSE_CROSSOVER_RATIO, GQA_KERNEL_CROSSOVER_RATIO, indexer_topk, sparse_attention
from dsv32.dsa.attention import dense_attention, nonempty_rows, selection_mask
from dsv32.dsa.kernels import cpu as cpu_kernels


def masked_dense(q, k, v, idx, scale):
    return dense_attention(q, k, v, scale, nonempty_rows(selection_mask(idx, k.shape[1])))


def kernel(q, k, v, idx, scale):
    return sparse_attention(q, k, v, idx, scale)


def torch_gather(q, k, v, idx, scale):
    with cpu_kernels.enabled(False):
        return sparse_attention(q, k, v, idx, scale)


def sdpa(q, k, v, idx, scale):
    """A dense model's decode step: the query against every cached key."""
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    return F.scaled_dot_product_attention(qh, kh, vh, scale=scale, enable_gqa=True)


def timed(paths, q, k, v, idx, scale, reps: int, meter: Meter) -> tuple[dict[str, float], dict]:
    """Median seconds per call of each path, repetitions interleaved after one warm-up call each, and
    others' share of the machine meanwhile."""
    fns = {name: functools.partial(fn, q, k, v, idx, scale) for name, fn in paths.items()}
    runs = interleaved(fns, reps, meter)
    return {name: runs.median(name) for name in fns}, runs.contention()


def inputs(L: int, T: int, args, g: torch.Generator):
    """Queries ``[1, T, H, D]`` and K/V views ``[1, L, H_kv, D]`` of a cache with room to spare, and
    the indexer's top-k of random index queries and keys."""
    H, Hkv, D, dtype = args.heads, args.kv_heads, args.head_dim, getattr(torch, args.dtype)
    q = torch.randn(1, T, H, D, generator=g).to(dtype)
    k = torch.randn(1, Hkv, L + 256, D, generator=g).to(dtype)[:, :, :L].transpose(1, 2)
    v = torch.randn(1, Hkv, L + 256, D, generator=g).to(dtype)[:, :, :L].transpose(1, 2)
    idx = indexer_topk(
        torch.randn(1, T, 4, 64, generator=g), torch.rand(1, T, 4, generator=g), torch.randn(1, L, 64, generator=g),
        args.topk,
    )  # fmt: skip
    return q, k, v, idx


@torch.no_grad()
def prefill(args, g, meter: Meter) -> dict:
    rows = []
    scale = args.head_dim**-0.5
    for ratio in args.ratios:
        L = int(ratio * args.topk)
        paths = {"masked_dense": masked_dense, "kernel": kernel, "torch": torch_gather}
        times, contention = timed(paths, *inputs(L, L, args, g), scale, args.reps, meter)
        row = {
            "seq_len": L, "ratio": ratio, "masked_dense_s": times["masked_dense"], "sparse_s": times["kernel"],
            "torch_s": times["torch"], "kernel_vs_torch": times["torch"] / times["kernel"],
            "kernel_vs_masked_dense": times["masked_dense"] / times["kernel"], "contention": contention,
        }  # fmt: skip
        rows.append(row)
        print(json.dumps({"prefill": row}))
    return {"rows": rows, **crossover_point(rows)}


@torch.no_grad()
def decode(args, g, meter: Meter) -> list[dict]:
    rows = []
    scale = args.head_dim**-0.5
    for L in args.contexts:
        paths = {"sdpa": sdpa, "kernel": kernel, "torch": torch_gather}
        times, contention = timed(paths, *inputs(L, 1, args, g), scale, args.reps * 20, meter)
        row = {
            "context": L, **{f"{name}_us": 1e6 * t for name, t in times.items()},
            "kernel_vs_torch": times["torch"] / times["kernel"], "kernel_vs_sdpa": times["sdpa"] / times["kernel"],
            "contention": contention,
        }  # fmt: skip
        rows.append(row)
        print(json.dumps({"decode": row}))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topk", type=int, default=256)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--ratios", type=float, nargs="+", default=[1.5, 2, 2.5, 3, 4, 6, 8, 16])
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384, 65536])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="ratios 2, 4, 8; contexts 1K, 8K; 3 repetitions")
    add_max_wait(ap)
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args(argv)
    if args.quick:
        args.ratios, args.contexts, args.reps = [2, 4, 8], [1024, 8192], 3
    meter = Meter(max_wait=wait_budget(args))
    if not cpu_kernels.available():
        print(
            "the CPU C kernels are not available (no C compiler, or DSV32_CPU_KERNELS=0): nothing to compare"
        )
        return 0
    g = torch.Generator().manual_seed(0)
    result = {
        "shape": {"heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim, "topk": args.topk},
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
        "prefill": prefill(args, g, meter),
        "decode": decode(args, g, meter),
        "measurement": meter.facts(),
        "defaults": {"DENSE_CROSSOVER_RATIO": DENSE_CROSSOVER_RATIO, "GQA_KERNEL_CROSSOVER_RATIO": GQA_KERNEL_CROSSOVER_RATIO},
    }  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "attention_gqa.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"crossover_ratio": result["prefill"]["crossover_ratio"]}))
    _plot(result, out / "attention_gqa.png")
    return 0


def _plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    rows = result["prefill"]["rows"]
    for key, label in (
        ("masked_dense_s", "masked dense"),
        ("sparse_s", "C kernel"),
        ("torch_s", "torch gather"),
    ):
        a.plot([r["ratio"] for r in rows], [1e3 * r[key] for r in rows], marker="o", label=label)
    a.set(xscale="log", yscale="log", xlabel="L / k", ylabel="prefill attention (ms)", title="prefill")
    a.legend()
    rows = result["decode"]
    for key, label in (
        ("sdpa_us", "dense SDPA (all keys)"),
        ("kernel_us", "C kernel"),
        ("torch_us", "torch gather"),
    ):
        b.plot([r["context"] for r in rows], [r[key] for r in rows], marker="o", label=label)
    b.set(xscale="log", yscale="log", xlabel="context (tokens)", ylabel="decode step (µs)", title="decode")
    b.legend()
    s = result["shape"]
    fig.suptitle(f"GQA sparse attention, {s['heads']}/{s['kv_heads']} heads × {s['head_dim']}, k {s['topk']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
