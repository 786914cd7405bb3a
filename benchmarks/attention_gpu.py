"""DSA attention on a CUDA GPU: our Triton kernels against dense SDPA and dense MLA decode (bf16).

    python benchmarks/attention_gpu.py                          # L 8K–128K, k 512 / 2048
    python benchmarks/attention_gpu.py --seq-len 32768 --topk 512 --heads 128

Paths (V3.2 attention; default 16 heads like benchmarks/attention.py, ``--heads 128`` for V3.2's):

- prefill (a) ``sdpa``: causal ``scaled_dot_product_attention`` over per-head q/K/V (qk 192, v 128;
  PyTorch picks its fastest backend — flash / cuDNN / memory-efficient); (c) ``ours``: ``W_UK``
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
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from dsv32.dsa import indexer_topk, sparse_mla_attention, sparse_mla_attention_reference  # noqa: E402
from dsv32.dsa.kernels import gpu as triton_kernels  # noqa: E402


class Inputs:
    def __init__(self, L: int, heads: int, dtype: torch.dtype, seed: int = 0) -> None:
        g = torch.Generator(device="cuda").manual_seed(seed)

        def randn(*shape, std=1.0):
            return (torch.randn(*shape, generator=g, device="cuda") * std).to(dtype)

        self.L, self.H = L, heads
        self.scale = 192**-0.5
        self.q_nope, self.q_rope = randn(1, L, heads, 128), randn(1, L, heads, 64)
        self.kv = randn(1, L, 576)
        w_kv_b = randn(heads, 256, 512, std=512**-0.5)
        self.w_uk, self.w_uv = w_kv_b[:, :128], w_kv_b[:, 128:]
        self.iq, self.ik = randn(1, L, 4, 64), randn(1, L, 64)
        self.iw = randn(1, L, 4, std=256**-0.5).float()
        kv = F.linear(self.kv[..., :512], w_kv_b.reshape(-1, 512)).view(1, L, heads, 256)
        k = torch.cat((kv[..., :128], self.kv[..., 512:].unsqueeze(2).expand(1, L, heads, 64)), -1)
        self.q_mha = torch.cat((self.q_nope, self.q_rope), -1).transpose(1, 2).contiguous()
        self.k_mha = k.transpose(1, 2).contiguous()
        self.v_pad = F.pad(kv[..., 128:], (0, 64)).transpose(1, 2).contiguous()

    def absorbed(self, rows: slice) -> torch.Tensor:
        q = torch.einsum("bthd,hdc->bthc", self.q_nope[:, rows], self.w_uk)
        return torch.cat((q, self.q_rope[:, rows]), -1)


def prefill_sdpa(x: Inputs) -> torch.Tensor:
    """V zero-padded to Q/K's 192 so that the flash kernels apply (as MLA prefill kernels do)."""
    out = F.scaled_dot_product_attention(x.q_mha, x.k_mha, x.v_pad, is_causal=True, scale=x.scale)
    return out[..., :128]


def prefill_ours(x: Inputs, k: int) -> torch.Tensor:
    q = x.absorbed(slice(None))
    idx = indexer_topk(x.iq, x.iw, x.ik, k)
    out = sparse_mla_attention(q, x.kv, idx, x.scale, 512)
    return torch.einsum("bthc,hdc->bthd", out, x.w_uv)


def decode_sdpa(x: Inputs) -> torch.Tensor:
    return F.scaled_dot_product_attention(x.q_mha[:, :, -1:], x.k_mha, x.v_pad, scale=x.scale)[..., :128]


def decode_dense_mla(x: Inputs) -> torch.Tensor:
    q = x.absorbed(slice(-1, None))[:, 0]  # [1, H, 576]
    p = torch.softmax(torch.matmul(q, x.kv.transpose(1, 2)).float() * x.scale, -1).to(q.dtype)
    return torch.einsum("bhc,hdc->bhd", torch.matmul(p, x.kv[..., :512]), x.w_uv)


def decode_ours(x: Inputs, k: int) -> torch.Tensor:
    q = x.absorbed(slice(-1, None))
    idx = indexer_topk(x.iq[:, -1:], x.iw[:, -1:], x.ik, k)
    out = sparse_mla_attention(q, x.kv, idx, x.scale, 512)
    return torch.einsum("bthc,hdc->bthd", out, x.w_uv)


def check(heads: int) -> dict:
    """Ours (bf16 kernels) against the fp64 masked reference at 4K tokens, k 512."""
    x = Inputs(4096, heads, torch.bfloat16, seed=1)
    q = x.absorbed(slice(None))
    idx = indexer_topk(x.iq, x.iw, x.ik, 512)
    got = sparse_mla_attention(q, x.kv, idx, x.scale, 512)
    rows = slice(3000, 3064)  # the reference is O(T·S): check a block of late queries
    ref = sparse_mla_attention_reference(q[:, rows].double(), x.kv.double(), idx[:, rows], x.scale, 512)
    rel = ((got[:, rows].double() - ref).norm() / ref.norm()).item()
    return {"sparse_mla_rel_err_bf16": rel}


def measure(L: int, heads: int, topks: list[int], ms) -> list[dict]:
    """Every path at one length, one result per k (the dense baselines timed once)."""
    x = Inputs(L, heads, torch.bfloat16)
    t_sdpa = ms(lambda: prefill_sdpa(x))
    t_dec_sdpa, t_dec_mla = ms(lambda: decode_sdpa(x)), ms(lambda: decode_dense_mla(x))
    rows = []
    q = x.absorbed(slice(None))
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
