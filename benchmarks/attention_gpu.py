"""DSA attention on a CUDA GPU: our Triton kernels against dense SDPA and dense MLA decode (bf16).

    python benchmarks/attention_gpu.py                          # L 8K–128K, k 512 / 2048
    python benchmarks/attention_gpu.py --seq-len 32768 --topk 512 --heads 128

The inputs and timed paths are benchmarks/attention.py's, in bf16 on the GPU (default 16 heads,
``--heads 128`` for V3.2's):

- prefill (a) ``sdpa``: causal ``scaled_dot_product_attention`` over per-head q/K/V (qk 192, V
  zero-padded from 128 to 192 so that PyTorch's flash kernels apply); (c) ``ours``: ``W_UK``
  absorption, fused indexer scores + exact top-k (:func:`dsv32.dsa.indexer_topk`), fused sparse MLA
  attention over the gathered latents (:func:`dsv32.dsa.sparse_mla_attention`), ``W_UV``;
  ``ours_attention``: the sparse attention kernel alone; ``ours_indexer``: the indexer alone.
- decode (one query against an L-token cache): (a) SDPA over the per-head K/V cache; (d) dense MLA in
  absorbed/MQA mode over all L latents (how V3.1 decodes); (c) ours: indexer over the cache, top-k,
  sparse attention (split across SMs).

Times are medians of ``triton.testing.do_bench`` (CUDA events, warm-up excluded); ratios are from the
same run. Writes ``runs/bench/attention_gpu.json``; without a CUDA device it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

# the same inputs and timed paths as the CPU benchmark, on the GPU
from attention import (  # noqa: E402
    Inputs,
    Shape,
    decode_dense_mla,
    decode_ours,
    decode_sdpa,
    prefill_ours,
    prefill_sdpa,
)

from dsv32.dsa import indexer_topk, sparse_mla_attention, sparse_mla_attention_reference  # noqa: E402
from dsv32.dsa.kernels import gpu as triton_kernels  # noqa: E402


def inputs(L: int, heads: int, seed: int = 0) -> Inputs:
    return Inputs(Shape(heads=heads), L, torch.bfloat16, seed=seed, device="cuda")


def check(heads: int) -> dict:
    """Ours (bf16 kernels) against the fp64 masked reference at 4K tokens, k 512."""
    x = inputs(4096, heads, seed=1)
    q = x.absorbed_queries(slice(None))
    idx = indexer_topk(x.iq, x.iw, x.ik, 512)
    got = sparse_mla_attention(q, x.kv, idx, x.scale, 512)
    rows = slice(3000, 3064)  # the reference is O(T·S): check a block of late queries
    ref = sparse_mla_attention_reference(q[:, rows].double(), x.kv.double(), idx[:, rows], x.scale, 512)
    rel = ((got[:, rows].double() - ref).norm() / ref.norm()).item()
    return {"sparse_mla_rel_err_bf16": rel}


def measure(L: int, heads: int, topks: list[int], ms) -> list[dict]:
    """Every path at one length, one result per k (the dense baselines timed once)."""
    x = inputs(L, heads)
    t_sdpa = ms(lambda: prefill_sdpa(x, 0))
    t_dec_sdpa, t_dec_mla = ms(lambda: decode_sdpa(x, 0)), ms(lambda: decode_dense_mla(x, 0))
    rows = []
    q = x.absorbed_queries(slice(None))
    for k in topks:
        idx = indexer_topk(x.iq, x.iw, x.ik, k)
        p = {
            "sdpa": t_sdpa,
            "ours": ms(lambda k=k: prefill_ours(x, k)),
            "ours_indexer": ms(lambda k=k: indexer_topk(x.iq, x.iw, x.ik, k)),
            "ours_attention": ms(lambda i=idx: sparse_mla_attention(q, x.kv, i, x.scale, 512)),
        }
        d = {"sdpa": t_dec_sdpa, "dense_mla": t_dec_mla, "ours": ms(lambda k=k: decode_ours(x, k))}
        r = {"seq_len": L, "topk": k, "prefill_ms": p, "decode_ms": d}
        r["prefill_speedup_vs_sdpa"] = p["sdpa"] / p["ours"]
        r["decode_speedup_vs_sdpa"] = d["sdpa"] / d["ours"]
        r["decode_speedup_vs_dense_mla"] = d["dense_mla"] / d["ours"]
        rows.append(r)
        print(
            f"L={L:>6} k={k:>4} | prefill ms: sdpa {p['sdpa']:8.2f} ours {p['ours']:8.2f} "
            f"(indexer {p['ours_indexer']:7.2f}, attention {p['ours_attention']:7.2f}) → "
            f"{r['prefill_speedup_vs_sdpa']:5.2f}x | decode ms: sdpa {d['sdpa']:.3f} dense-mla "
            f"{d['dense_mla']:.3f} ours {d['ours']:.3f} → {r['decode_speedup_vs_sdpa']:5.2f}x / "
            f"{r['decode_speedup_vs_dense_mla']:5.2f}x",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> dict | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", type=int, nargs="*", default=[8192, 32768, 131072])
    ap.add_argument("--topk", type=int, nargs="*", default=[512, 2048])
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--out", default="runs/bench")
    ap.add_argument("--quick", action="store_true", help="L 8K and 32K only")
    args = ap.parse_args(argv)
    if not (torch.cuda.is_available() and triton_kernels.triton is not None):
        print("attention_gpu: no CUDA device with Triton here — skipped")
        return None
    from triton.testing import do_bench

    lengths = [L for L in args.seq_len if not args.quick or L <= 32768]
    result = {"device": torch.cuda.get_device_name(), "heads": args.heads, "dtype": "bfloat16", "points": []}
    result.update(check(args.heads))
    print(f"{result['device']}: {args.heads} heads, bf16; kernel vs fp64 reference: "
          f"rel err {result['sparse_mla_rel_err_bf16']:.1e}", flush=True)  # fmt: skip

    def ms(fn) -> float:
        return float(do_bench(fn, warmup=50, rep=400, return_mode="median"))

    for L in lengths:
        result["points"].extend(measure(L, args.heads, args.topk, ms))
        torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "attention_gpu.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
