"""DSA attention speed: ours (O(L·k)) against dense SDPA, masked-dense DSA and dense MLA decode.

    python benchmarks/attention.py                      # full grid: L 1K..32K × k {256, 512, 2048}
    python benchmarks/attention.py --quick              # L 1K..4K × k {256, 512}, 2 repetitions
    python benchmarks/attention.py --seq-len 8192 --topk 512 --json   # one point, one JSON line
    python benchmarks/attention.py --crossover          # where sparse prefill starts to beat dense
    python benchmarks/attention.py --tune               # chunk-size sweep of the fast paths

Default shape: V3.2 attention at a small width — 16 heads, qk 128 (nope) + 64 (rope), v 128,
latent 512 + rope 64, indexer 4 heads × 64 — batch 1, fp32, all CPU cores (``--threads``).

What each timing covers (inputs are the per-token projections a layer has made before attention;
all paths of one point see the same tensors):

- prefill (a) ``sdpa``: ``F.scaled_dot_product_attention(is_causal=True)`` over per-head q/K/V
  ``[B, 16, L, 192|128]`` precomputed like a standard model's cache — what a dense model runs — with
  V zero-padded to 192 so PyTorch's flash kernel runs (the fastest dense baseline on this CPU);
  ``sdpa_math`` is the same call with V left at 128, which falls back to the math backend (O(L²)
  memory, ~4× slower at 8K; skipped above ``--math-max-len`` and wherever its scores would not fit
  in the available memory, ~3 · B·H·L² fp32 values: 12 GB at 8K, 48 GB at 16K);
- prefill (b) ``masked_dense``: the transformers way — MLA's MHA mode (per-head K/V expanded from the
  latents with ``kv_b_proj``, timed), our indexer's top-k, a boolean ``[B, L, L]`` selection mask, and
  SDPA with that mask (O(L²) time and memory; skipped above ``--masked-max-len`` or where it would not
  fit, like (a-math)); this is also the model's masked path that ``--crossover`` compares;
- prefill (c) ``ours``: the whole DSA attention in MLA's MQA mode — indexer scoring + top-k (chunked,
  streaming), then ``dsv32.dsa.sparse_mla_attention_absorbed``: ``W_UK`` absorbed into the queries,
  sparse attention over the selected latents, ``W_UV`` on the output (a chunk of queries at a time
  on the C kernel's path); ``ours_mha_gather``: the same selection in MHA mode — expand per-head K/V from the
  latents with ``kv_b_proj`` (timed) and gather them per head (``dsv32.dsa.sparse_attention``);
  ``ours_torch``: (c) with the C kernels turned off (the torch gather + batched-matmul path), so the
  kernels' own gain is measured in the same run (skipped above ``--torch-max-len``);
- decode (one new query against a cache of L entries, mean of ``--decode-steps`` calls):
  (a) ``sdpa`` over the per-head K/V cache; (d) ``dense_mla``: absorbed MQA over all L latents
  ``[B, L, 576]`` — how V3.1 decodes; (c) ``ours``: absorbed query, indexer over the whole cache
  (one matmul) + top-k, attention over the k gathered latents, ``W_UV``; ``ours_torch`` without the
  C kernels. On the CPU (fp32/bf16) (c) runs the C kernels of ``dsv32.dsa.kernels.cpu``.
- ``peak_mem_mb``: peak MB of tensors alive at once during one call (allocator events recorded by
  the torch profiler), not counting the inputs — the same instrument as tests/dsa/test_memory.py.
  That profiled call is also each path's warm-up; it is not timed.
- ``others_cpu_share``: share of the machine's CPU time other processes used during each timed
  repetition (None for a measurement shorter than 0.1 s, which /proc/stat's 10 ms ticks cannot
  resolve); ``contention``: the same over each repetition block (one call of every path) and over
  all of them; ``measurement``: the load average, and how long the run waited for a quiet machine.
  Before the first block the benchmark waits for a quiet machine, and again after a contended one,
  but the whole run waits at most ``--max-wait`` seconds: with torch on every core a busy core stalls
  each parallel op, and on a machine that is never quiet the contention is recorded rather than
  waited out (``benchmarks/_timing.py``).

Repetitions are interleaved (a, b, c, a, b, c, ...) and every ratio is a ratio of medians from the
same run. Writes ``runs/bench/attention.json`` (after each length, so a run stopped part-way keeps
the lengths it finished) and ``attention.png`` (grid), or ``attention_crossover.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from _timing import Meter, add_max_wait, interleaved, wait_budget  # benchmarks/_timing.py, beside this script
from torch.profiler import ProfilerActivity, profile

from dsv32 import dsa
from dsv32.dsa import (
    indexer_topk,
    selection_mask,
    sparse_attention,
    sparse_mla_attention,
    sparse_mla_attention_absorbed,
)
from dsv32.dsa.kernels import cpu as cpu_kernels

GRID_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768)
GRID_TOPK = (256, 512, 2048)
QUICK_LENGTHS = (1024, 2048, 4096)
QUICK_TOPK = (256, 512)


@dataclass
class Shape:
    """Attention dims (V3.2's per-head dims, 16 heads instead of 128)."""

    batch: int = 1
    heads: int = 16
    qk_nope: int = 128
    qk_rope: int = 64
    v_dim: int = 128
    kv_lora: int = 512
    index_heads: int = 4
    index_dim: int = 64

    def describe(self) -> str:
        return (
            f"batch {self.batch}, {self.heads} heads, qk {self.qk_nope}+{self.qk_rope}, v {self.v_dim}, "
            f"latent {self.kv_lora} + rope {self.qk_rope}, indexer {self.index_heads} heads × {self.index_dim}"
        )


class Inputs:
    """Random per-token projections of one layer for ``L`` tokens (what attention receives)."""

    def __init__(self, s: Shape, L: int, dtype: torch.dtype, seed: int = 0, device: str = "cpu") -> None:
        g = torch.Generator(device=device).manual_seed(seed)

        def randn(*shape, std=1.0):
            return (torch.randn(*shape, generator=g, device=device) * std).to(dtype)

        B, H = s.batch, s.heads
        self.shape, self.L = s, L
        self.scale = (s.qk_nope + s.qk_rope) ** -0.5
        self.q_nope = randn(B, L, H, s.qk_nope)
        self.q_rope = randn(B, L, H, s.qk_rope)
        self.kv = randn(B, L, s.kv_lora + s.qk_rope)  # MLA cache: normalized latent + roped key
        self.w_kv_b = randn(H, s.qk_nope + s.v_dim, s.kv_lora, std=s.kv_lora**-0.5)
        self.w_uk, self.w_uv = self.w_kv_b[:, : s.qk_nope], self.w_kv_b[:, s.qk_nope :]
        self.iq = randn(B, L, s.index_heads, s.index_dim)
        self.iw = randn(B, L, s.index_heads, std=(s.index_heads * s.index_dim) ** -0.5).float()
        self.ik = randn(B, L, s.index_dim)
        # (a)/(b): per-head q/K/V, precomputed as a standard model's cache holds them.
        k_nope, v = self.expand()
        self.q_mha = torch.cat((self.q_nope, self.q_rope), -1).transpose(1, 2).contiguous()
        k = torch.cat((k_nope, self.kv[..., s.kv_lora :].unsqueeze(2).expand(B, L, H, s.qk_rope)), -1)
        self.k_mha = k.transpose(1, 2).contiguous()
        self.v_mha = v.transpose(1, 2).contiguous()
        # flash SDPA needs V as wide as Q/K: zero-padded (what MLA prefill kernels do too)
        self.v_pad = F.pad(self.v_mha, (0, s.qk_nope + s.qk_rope - s.v_dim))

    def expand(self) -> tuple[torch.Tensor, torch.Tensor]:
        """MHA mode: per-head ``k_nope``, ``v`` ``[B, L, H, *]`` from the latents (``kv_b_proj``)."""
        s = self.shape
        kv = F.linear(self.kv[..., : s.kv_lora], self.w_kv_b.reshape(-1, s.kv_lora))
        return kv.view(s.batch, self.L, s.heads, -1).split([s.qk_nope, s.v_dim], dim=-1)

    def absorbed_queries(self, rows: slice) -> torch.Tensor:
        """MQA mode: ``[B, T, H, 576]`` = (q_nope · W_UK, q_rope)."""
        q = torch.einsum("bthd,hdc->bthc", self.q_nope[:, rows], self.w_uk)
        return torch.cat((q, self.q_rope[:, rows]), dim=-1)


# --- the timed paths -------------------------------------------------------------------------


def prefill_sdpa(x: Inputs, topk: int) -> torch.Tensor:
    """The fastest dense SDPA PyTorch has here: its flash kernel needs V as wide as Q/K (192), so it
    runs on V zero-padded from 128 and the output is sliced back."""
    out = F.scaled_dot_product_attention(x.q_mha, x.k_mha, x.v_pad, is_causal=True, scale=x.scale)
    return out[..., : x.v_mha.shape[-1]]


def prefill_sdpa_math(x: Inputs, topk: int) -> torch.Tensor:
    """SDPA called as is: V narrower than Q/K rules out the flash kernel → the math backend, which
    materializes the [B, H, L, L] scores (O(L²) memory)."""
    return F.scaled_dot_product_attention(x.q_mha, x.k_mha, x.v_mha, is_causal=True, scale=x.scale)


def prefill_masked_dense(x: Inputs, topk: int) -> torch.Tensor:
    s = x.shape
    k_nope, v = x.expand()  # MHA mode, as transformers' DeepseekV32 (and our masked path) run it
    k = torch.cat((k_nope, x.kv[..., s.kv_lora :].unsqueeze(2).expand(-1, -1, s.heads, -1)), dim=-1)
    idx = indexer_topk(x.iq, x.iw, x.ik, topk)
    mask = selection_mask(idx, x.L).unsqueeze(1)  # [B, 1, L, L]
    return F.scaled_dot_product_attention(
        x.q_mha, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=x.scale
    )


def prefill_ours(x: Inputs, topk: int) -> torch.Tensor:
    idx = indexer_topk(x.iq, x.iw, x.ik, topk)
    # W_UK absorbed into the queries, attention over the selected latents, W_UV: as the model runs it
    return sparse_mla_attention_absorbed(x.q_nope, x.q_rope, x.kv, idx, x.scale, x.w_uk, x.w_uv)


def prefill_ours_mha_gather(x: Inputs, topk: int) -> torch.Tensor:
    s = x.shape
    k_nope, v = x.expand()
    k = torch.cat((k_nope, x.kv[..., s.kv_lora :].unsqueeze(2).expand(-1, -1, s.heads, -1)), dim=-1)
    q = torch.cat((x.q_nope, x.q_rope), dim=-1)
    idx = indexer_topk(x.iq, x.iw, x.ik, topk)
    return sparse_attention(q, k, v, idx, x.scale)


def prefill_ours_torch(x: Inputs, topk: int) -> torch.Tensor:
    with cpu_kernels.enabled(False):  # the same path without the C kernels: torch gather + bmm
        return prefill_ours(x, topk)


def decode_sdpa(x: Inputs, topk: int) -> torch.Tensor:
    q = x.q_mha[:, :, -1:]
    return F.scaled_dot_product_attention(q, x.k_mha, x.v_mha, scale=x.scale)


def decode_dense_mla(x: Inputs, topk: int) -> torch.Tensor:
    q = x.absorbed_queries(slice(-1, None))[:, 0]  # [B, H, 576]
    scores = torch.matmul(q, x.kv.transpose(1, 2)).mul_(x.scale)  # [B, H, L]
    latent_out = torch.matmul(scores.softmax(dim=-1), x.kv[..., : x.shape.kv_lora])
    return torch.einsum("bhc,hdc->bhd", latent_out, x.w_uv)


def decode_ours(x: Inputs, topk: int) -> torch.Tensor:
    idx = indexer_topk(x.iq[:, -1:], x.iw[:, -1:], x.ik, topk)  # [B, 1, k]
    return sparse_mla_attention_absorbed(
        x.q_nope[:, -1:], x.q_rope[:, -1:], x.kv, idx, x.scale, x.w_uk, x.w_uv
    )


def decode_ours_torch(x: Inputs, topk: int) -> torch.Tensor:
    with cpu_kernels.enabled(False):
        return decode_ours(x, topk)


# Paths timed once per length, not per k.
SHARED_PATHS = ("prefill.sdpa", "prefill.sdpa_math", "decode.sdpa", "decode.dense_mla")

COVERS = {
    "prefill.sdpa": "(a) causal flash SDPA over precomputed per-head q/K/V, V zero-padded to 192 (a dense model)",
    "prefill.sdpa_math": "(a-math) the same SDPA call with V at 128: PyTorch falls back to the O(L²) math path",
    "prefill.masked_dense": "(b) kv_b_proj expansion + indexer top-k + [B,L,L] selection mask + masked SDPA",
    "prefill.ours": "(c) MQA mode: W_UK absorption + indexer scores/top-k + gathered-latent attention + W_UV",
    "prefill.ours_mha_gather": "(c') MHA mode: kv_b_proj expansion + indexer top-k + per-head K/V gather",
    "prefill.ours_torch": "(c-torch) (c) without the C kernels: torch indexer + gather + batched matmuls",
    "decode.sdpa": "(a) one query, SDPA over the per-head K/V cache",
    "decode.dense_mla": "(d) one query, absorbed MQA over all L latents (V3.1 decode) incl. W_UK/W_UV",
    "decode.ours": "(c) one query, W_UK + indexer over the cache + top-k + k gathered latents + W_UV",
    "decode.ours_torch": "(c-torch) (c) without the C kernels",
}


# --- measurement ---------------------------------------------------------------------------


def peak_mb(fn: Callable[[], object]) -> float:
    """Peak MB of tensors allocated and alive at once while ``fn`` runs (the allocator's events,
    recorded by the torch profiler; inputs allocated before the call are not counted)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
    )
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return round(peak / 2**20, 1)


@dataclass
class Plan:
    lengths: tuple[int, ...]
    topks: tuple[int, ...]
    reps: int
    decode_steps: int
    masked_max_len: int
    mha_max_len: int
    math_max_len: int | None
    dtype: torch.dtype
    shape: Shape
    torch_max_len: int = 0  # (c-torch) up to this L, when the C kernels are built


def available_bytes() -> int:
    """Memory available to a new allocation now (``MemAvailable``; physical memory without /proc)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def quadratic_bytes(s: Shape, L: int) -> int:
    """Estimated peak of the O(L²) paths, (a-math) and (b): 3 fp32 ``[B, H, L, L]`` score tensors
    (measured with ``peak_mb``: 2.4 at L 2048, 2.2–2.4 at 8192, in fp32 and bf16 alike)."""
    return 3 * s.batch * s.heads * L * L * 4


def measure_length(plan: Plan, L: int, meter: Meter, log: Callable[[str], None]) -> list[dict]:
    """All paths at one length for every k, repetitions interleaved → one result dict per k."""
    x = Inputs(plan.shape, L, plan.dtype)
    with torch.no_grad():  # what the model's prefill would dispatch to (its crossover depends on it)
        kernel = dsa.mla_kernel_would_run(x.kv)
    with_torch = plan.torch_max_len >= L and cpu_kernels.available()
    need, free = quadratic_bytes(plan.shape, L), available_bytes()
    fits = need <= free
    skipped: dict[str, str] = {}
    for name, limit in (
        ("prefill.sdpa_math", plan.math_max_len),
        ("prefill.masked_dense", plan.masked_max_len),
    ):
        if limit is not None and limit < L:
            skipped[name] = f"L above {limit}"
        elif not fits:
            skipped[name] = f"needs ~{need / 2**30:.1f} GB of L² scores, {free / 2**30:.1f} GB available"
            log(f"  L={L:>6} skipping {name}: {skipped[name]}")
    jobs: list[tuple[str, int | None, Callable[[], object], int]] = [
        ("prefill.sdpa", None, lambda: prefill_sdpa(x, 0), 1)
    ]
    if "prefill.sdpa_math" not in skipped:
        jobs.append(("prefill.sdpa_math", None, lambda: prefill_sdpa_math(x, 0), 1))
    for k in plan.topks:
        if "prefill.masked_dense" not in skipped:
            jobs.append(("prefill.masked_dense", k, lambda k=k: prefill_masked_dense(x, k), 1))
        jobs.append(("prefill.ours", k, lambda k=k: prefill_ours(x, k), 1))
        if plan.mha_max_len >= L:
            jobs.append(("prefill.ours_mha_gather", k, lambda k=k: prefill_ours_mha_gather(x, k), 1))
        if with_torch:
            jobs.append(("prefill.ours_torch", k, lambda k=k: prefill_ours_torch(x, k), 1))
    steps = plan.decode_steps
    jobs.append(("decode.sdpa", None, lambda: decode_sdpa(x, 0), steps))
    jobs.append(("decode.dense_mla", None, lambda: decode_dense_mla(x, 0), steps))
    for k in plan.topks:
        jobs.append(("decode.ours", k, lambda k=k: decode_ours(x, k), steps))
        if with_torch:
            jobs.append(("decode.ours_torch", k, lambda k=k: decode_ours_torch(x, k), steps))

    def logged(rep: int, job: tuple[str, int | None], t: float, others: float | None) -> None:
        flag = (
            f"  (others used {others:.0%} of the CPU)"
            if others is not None and others >= meter.threshold
            else ""
        )
        log(
            f"  L={L:>6} rep {rep + 1}/{plan.reps} {job[0]:<24} k={job[1] or '-':<5} {t * 1e3:10.1f} ms{flag}"
        )

    with torch.no_grad():
        # Peak memory: one profiled call per path, which is also its warm-up (not timed).
        mems = {(name, k): peak_mb(fn) for name, k, fn, _ in jobs}
        runs = interleaved(
            {(name, k): fn for name, k, fn, _ in jobs}, plan.reps, meter, warmup=False,
            calls={(name, k): calls for name, k, _, calls in jobs}, log=logged,
        )  # fmt: skip
    times, contention = runs.seconds, runs.others
    load_1min = round(os.getloadavg()[0], 2)  # after the runs: other jobs make ratios noisy
    results = []
    for k in plan.topks:

        def key(name: str, k=k) -> tuple[str, int | None]:
            return (name, None if name in SHARED_PATHS else k)

        def get(name):
            return statistics.median(times[key(name)]) if key(name) in times else None

        def mem_of(name):
            m = mems.get(key(name))
            return None if m is None else round(m, 1)

        pre = {n.removeprefix("prefill."): get(n) for n in COVERS if n.startswith("prefill.")}
        dec = {n.removeprefix("decode."): get(n) for n in COVERS if n.startswith("decode.")}
        layouts = {m: pre[m] for m in ("ours", "ours_mha_gather") if pre[m] is not None}
        r = {
            "seq_len": L,
            "topk": k,
            "batch": plan.shape.batch,
            "threads": torch.get_num_threads(),
            "load_average_1min": load_1min,
            "contention": runs.contention(),
            "measurement": meter.facts(),
            "skipped": skipped,
            "dtype": str(plan.dtype).removeprefix("torch."),
            "reps": plan.reps,
            "prefill_s": pre,
            "decode_s_per_token": dec,
            "prefill_speedup_vs_sdpa": pre["sdpa"] / pre["ours"],
            "prefill_speedup_vs_sdpa_math": pre["sdpa_math"] / pre["ours"] if pre["sdpa_math"] else None,
            "prefill_speedup_vs_masked_dense": (
                pre["masked_dense"] / pre["ours"] if pre["masked_dense"] is not None else None
            ),
            "decode_speedup_vs_sdpa": dec["sdpa"] / dec["ours"],
            "decode_speedup_vs_dense_mla": dec["dense_mla"] / dec["ours"],
            "prefill_speedup_of_c_kernels": pre["ours_torch"] / pre["ours"] if pre["ours_torch"] else None,
            "decode_speedup_of_c_kernels": dec["ours_torch"] / dec["ours"] if dec["ours_torch"] else None,
            "prefill_faster_gather_layout": min(layouts, key=layouts.get),
            "mla_prefill_dispatch": "masked_dense"
            if dsa.prefer_dense(L, L, k, mla_kernel=kernel)
            else "sparse",
            "peak_mem_mb": {n: mem_of(n) for n in COVERS},
            "repetitions_s": {n: times.get(key(n)) for n in COVERS},
            "others_cpu_share": {n: contention.get(key(n)) for n in COVERS},
            "covers": COVERS,
        }
        results.append(r)
    return results


def summarize(r: dict) -> str:
    p, d = r["prefill_s"], r["decode_s_per_token"]

    def ms(v):
        return "      -" if v is None else f"{v * 1e3:9.1f}"

    return (
        f"L={r['seq_len']:>6} k={r['topk']:>5} | prefill ms: sdpa {ms(p['sdpa'])} masked {ms(p['masked_dense'])} "
        f"ours {ms(p['ours'])} (mha-gather {ms(p['ours_mha_gather'])}, torch path {ms(p['ours_torch'])}) "
        f"→ {r['prefill_speedup_vs_sdpa']:5.2f}x "
        f"| decode ms: sdpa {ms(d['sdpa'])} dense-mla {ms(d['dense_mla'])} ours {ms(d['ours'])} "
        f"(torch path {ms(d['ours_torch'])}) → "
        f"{r['decode_speedup_vs_sdpa']:6.2f}x / {r['decode_speedup_vs_dense_mla']:5.2f}x"
    )


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    lengths = sorted({r["seq_len"] for r in results})
    first = {L: next(r for r in results if r["seq_len"] == L) for L in lengths}
    ax1.plot(lengths, [first[L]["prefill_s"]["sdpa"] for L in lengths], "k-o", label="(a) dense SDPA")
    ax2.plot(
        lengths, [first[L]["decode_s_per_token"]["sdpa"] * 1e3 for L in lengths], "k-o", label="(a) SDPA"
    )
    ax2.plot(
        lengths,
        [first[L]["decode_s_per_token"]["dense_mla"] * 1e3 for L in lengths],
        "k--s",
        label="(d) dense MLA (MQA)",
    )
    for k in sorted({r["topk"] for r in results}):
        rows = sorted((r for r in results if r["topk"] == k), key=lambda r: r["seq_len"])
        Ls = [r["seq_len"] for r in rows]
        (line,) = ax1.plot(Ls, [r["prefill_s"]["ours"] for r in rows], "-o", label=f"(c) ours k={k}")
        masked = [
            (r["seq_len"], r["prefill_s"]["masked_dense"]) for r in rows if r["prefill_s"]["masked_dense"]
        ]
        if masked:
            ax1.plot(*zip(*masked), ":x", color=line.get_color(), label=f"(b) masked-dense k={k}")
        ax2.plot(Ls, [r["decode_s_per_token"]["ours"] * 1e3 for r in rows], "-o", label=f"(c) ours k={k}")
    for ax, title, unit in ((ax1, "prefill latency", "s"), (ax2, "decode latency per token", "ms")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence / cache length L")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    r0 = results[0]
    fig.suptitle(f"DSA attention, {r0['threads']} threads, {r0['dtype']}, batch {r0['batch']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- crossover and tuning ------------------------------------------------------------------


def crossover(plan: Plan, ratios: tuple[float, ...], meter: Meter, log: Callable[[str], None]) -> dict:
    """Prefill (b) masked-dense vs (c) sparse for L = ratio · k: the smallest ratio from which the
    sparse path wins at every measured larger ratio, per k."""
    out: dict = {"ratios": list(ratios), "per_topk": {}}
    for k in plan.topks:
        rows = []
        for ratio in ratios:
            L = int(ratio * k)
            x = Inputs(plan.shape, L, plan.dtype)
            tb, tc = [], []
            with torch.no_grad():
                prefill_masked_dense(x, k)  # warm-up
                prefill_ours(x, k)
                for _ in range(plan.reps):
                    meter.wait_quiet()
                    tb.append(meter.run(lambda x=x, k=k: prefill_masked_dense(x, k), 1)[0])
                    tc.append(meter.run(lambda x=x, k=k: prefill_ours(x, k), 1)[0])
            b, c = statistics.median(tb), statistics.median(tc)
            rows.append({"seq_len": L, "ratio": ratio, "masked_dense_s": b, "sparse_s": c})
            log(
                f"  k={k:>5} L={L:>6} (L/k={ratio:4.1f}) masked-dense {b * 1e3:9.1f} ms  sparse {c * 1e3:9.1f} ms"
            )
        out["per_topk"][k] = {"rows": rows, **crossover_point(rows)}
    found = [v["crossover_ratio"] for v in out["per_topk"].values() if v["crossover_ratio"] is not None]
    out["crossover_ratio"] = max(found) if found else None
    out["current_default"] = dsa.DENSE_CROSSOVER_RATIO
    return out


def crossover_point(rows: list[dict]) -> dict:
    """``first_winning_ratio``: the smallest measured L/k from which sparse wins at every larger one;
    ``crossover_ratio``: where the speed ratio crosses 1, interpolated in log-log between it and the
    measured ratio below (None if sparse never wins; the smallest ratio if it always does)."""
    wins = [r["sparse_s"] < r["masked_dense_s"] for r in rows]
    first = next((i for i in range(len(rows)) if all(wins[i:])), None)
    if first is None:
        return {"first_winning_ratio": None, "crossover_ratio": None}
    ratio = rows[first]["ratio"]
    if first > 0:
        lo, hi = rows[first - 1], rows[first]
        y0 = math.log(lo["masked_dense_s"] / lo["sparse_s"])
        y1 = math.log(hi["masked_dense_s"] / hi["sparse_s"])
        x0, x1 = math.log(lo["ratio"]), math.log(hi["ratio"])
        ratio = math.exp(x0 + (x1 - x0) * (0 - y0) / (y1 - y0)) if y1 != y0 else hi["ratio"]
    return {"first_winning_ratio": rows[first]["ratio"], "crossover_ratio": round(ratio, 2)}


def tune(plan: Plan, L: int, k: int, meter: Meter, log: Callable[[str], None]) -> dict:
    """Sweep the chunking knobs of the fast paths at one point (results are identical)."""
    from dsv32.dsa import attention as attn_mod
    from dsv32.dsa import indexer as idx_mod

    x = Inputs(plan.shape, L, plan.dtype)
    q = x.absorbed_queries(slice(None))
    idx = indexer_topk(x.iq, x.iw, x.ik, k)
    out: dict = {"seq_len": L, "topk": k, "indexer": {}, "gather_budget": {}}
    with torch.no_grad():
        for chunk in (32, 64, 128, 256):
            t = min(
                meter.run(lambda c=chunk: indexer_topk(x.iq, x.iw, x.ik, k, chunk_size=c), 1)[0]
                for _ in range(plan.reps)
            )
            out["indexer"][chunk] = t
            log(f"  indexer chunk {chunk:>4}: {t * 1e3:9.1f} ms")
        saved = attn_mod.GATHER_BUDGET
        try:
            for budget in (512, 1024, 2048, 4096, 8192):
                attn_mod.GATHER_BUDGET = budget
                t = min(
                    meter.run(lambda: sparse_mla_attention(q, x.kv, idx, x.scale, 512), 1)[0]
                    for _ in range(plan.reps)
                )
                out["gather_budget"][budget] = t
                log(f"  gather budget {budget:>5} rows: {t * 1e3:9.1f} ms")
        finally:
            attn_mod.GATHER_BUDGET = saved
    out["defaults"] = {"INDEXER_QUERY_CHUNK": idx_mod.INDEXER_QUERY_CHUNK, "GATHER_BUDGET": saved}
    return out


def overlapping_selection(
    B: int, T: int, S: int, k: int, ratio: float, block: int, seed: int = 0
) -> torch.Tensor:
    """``[B, T, k]`` selections of the last ``T`` of ``S`` positions in which each block of ``block``
    neighbouring queries draws its keys from one shared pool of ``ratio · k`` keys visible to all of
    them — a controlled stand-in for a trained indexer (whose 64-query unions are ~3·k, see
    ``dsv32.dsa.union``); ``ratio = block`` approaches independent selections."""
    g = torch.Generator().manual_seed(seed)
    out = torch.empty(B, T, k, dtype=torch.long)
    for start in range(0, T, block):
        n = min(block, T - start)
        visible = S - T + start + 1
        pool_size = min(visible, max(k, round(ratio * k)))
        for b in range(B):
            pool = torch.randperm(visible, generator=g)[:pool_size]
            pick = torch.rand(n, pool_size, generator=g).topk(k, dim=-1).indices
            out[b, start : start + n] = pool[pick]
    return out


def union_sweep(plan: Plan, L: int, k: int, meter: Meter, log: Callable[[str], None]) -> dict:
    """Union blocks vs per-query gathers of :func:`dsv32.dsa.sparse_attention` (GQA layout) on
    selections with a controlled union size, for :data:`dsv32.dsa.union.UNION_MAX_RATIO_GQA`. The
    queries are the last half of ``L`` positions, so every pool fits in the visible keys. (MLA's MQA
    mode measured no gain from union blocks at any ratio and has none.)"""
    from dsv32.dsa import attention as attn_mod
    from dsv32.dsa import union as union_mod

    s = plan.shape
    T = L // 2
    g = torch.Generator().manual_seed(1)
    # GQA layout of a small dense model (SmolLM2-135M: 9 query heads on 3 KV heads of 64 dims).
    gqa_q = torch.randn(s.batch, T, 9, 64, generator=g)
    gqa_k = torch.randn(s.batch, L, 3, 64, generator=g)
    gqa_v = torch.randn(s.batch, L, 3, 64, generator=g)
    layouts = {
        "gqa": lambda idx, r: attn_mod.sparse_attention(gqa_q, gqa_k, gqa_v, idx, 0.125, union_ratio=r),
    }
    out: dict = {"seq_len": L, "queries": T, "topk": k, "block": union_mod.UNION_BLOCK, "layouts": {}}
    with torch.no_grad():
        for name, fn in layouts.items():
            rows = []
            for ratio in (1.25, 1.5, 2, 3, 4, 6, 8, 12, 16, 24):
                idx = overlapping_selection(s.batch, T, L, k, ratio, union_mod.UNION_BLOCK)
                t_gather, t_union = (
                    min(meter.run(lambda f=fn, i=idx, r=r: f(i, r), 1)[0] for _ in range(plan.reps))
                    for r in (0.0, float("inf"))
                )
                rows.append({"union_ratio": ratio, "gather_s": t_gather, "union_s": t_union,
                             "union_speedup": t_gather / t_union})  # fmt: skip
                log(f"  {name} |union|/k {ratio:>5}: gather {t_gather * 1e3:8.1f} ms  union "
                    f"{t_union * 1e3:8.1f} ms  → {t_gather / t_union:5.2f}x")  # fmt: skip
            faster = [r["union_ratio"] for r in rows if r["union_speedup"] > 1]
            out["layouts"][name] = {"rows": rows, "break_even_ratio": max(faster) if faster else None}
    out["defaults"] = {"UNION_MAX_RATIO_GQA": union_mod.UNION_MAX_RATIO_GQA}
    return out


def main(argv: list[str] | None = None) -> list[dict] | dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", type=int, nargs="*", help=f"lengths (default {GRID_LENGTHS})")
    ap.add_argument("--topk", type=int, nargs="*", help=f"k values (default {GRID_TOPK})")
    ap.add_argument("--json", action="store_true", help="print one JSON line per point (no table)")
    ap.add_argument("--quick", action="store_true", help=f"L {QUICK_LENGTHS}, k {QUICK_TOPK}, 2 repetitions")
    ap.add_argument("--crossover", action="store_true", help="measure the dense/sparse prefill crossover")
    ap.add_argument("--tune", action="store_true", help="sweep chunk sizes at one point (default 4096/512)")
    ap.add_argument(
        "--union-sweep",
        action="store_true",
        help="union blocks vs per-query gathers over the union size (default 8192/512)",
    )
    ap.add_argument("--reps", type=int, help="interleaved repetitions; the median is reported (default 3)")
    ap.add_argument("--decode-steps", type=int, default=10, help="decode calls averaged per repetition")
    ap.add_argument("--masked-max-len", type=int, default=8192, help="skip (b) above this L (O(L²) time)")
    ap.add_argument("--mha-max-len", type=int, default=8192, help="skip the MHA-gather variant above this L")
    ap.add_argument(
        "--torch-max-len",
        type=int,
        default=32768,
        help="skip (c-torch), ours without the C kernels, above this L",
    )
    ap.add_argument(
        "--math-max-len",
        type=int,
        default=None,
        help="skip (a-math) above this L (default: every L whose L² scores fit in the available memory; "
        "(a-math) and (b) are skipped wherever they would not)",
    )
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (default: all cores)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    add_max_wait(ap)
    ap.add_argument(
        "--retries",
        type=int,
        default=0,
        help="re-runs of a measurement other processes disturbed, while the --max-wait budget lasts",
    )
    ap.add_argument("--out", default="runs/bench", help="output directory")
    args = ap.parse_args(argv)
    meter = Meter(max_wait=wait_budget(args), retries=args.retries)

    torch.set_num_threads(args.threads)
    shape = Shape(batch=args.batch)
    lengths = tuple(args.seq_len or (QUICK_LENGTHS if args.quick else GRID_LENGTHS))
    topks = tuple(args.topk or (QUICK_TOPK if args.quick else GRID_TOPK))
    reps = args.reps or (2 if args.quick else 3)
    plan = Plan(lengths, topks, reps, args.decode_steps, args.masked_max_len, args.mha_max_len,
                args.math_max_len, getattr(torch, args.dtype), shape, args.torch_max_len)  # fmt: skip
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr if args.json else sys.stdout, flush=True)

    log(
        f"DSA attention benchmark — shape: {shape.describe()}; {args.dtype}, {torch.get_num_threads()} threads"
    )
    busy = os.getloadavg()[0]
    if busy > 0.5:
        log(
            f"warning: load average {busy:.2f}: other processes are running. With every core in use by torch "
            "a busy core stalls each parallel op, so timings (ours: many small ops) suffer most."
        )
    if args.tune:
        result = tune(plan, (args.seq_len or [4096])[0], (args.topk or [512])[0], meter, log)
        (out_dir / "attention_tune.json").write_text(json.dumps(result, indent=2))
        return result

    def special(result: dict, name: str, summary: str) -> dict:
        """A sweep's result: run facts added, written to ``attention_<name>.json``, summarized."""
        result.update(shape=asdict(shape), threads=torch.get_num_threads(), dtype=args.dtype)
        result["measurement"] = meter.facts()
        (out_dir / f"attention_{name}.json").write_text(json.dumps(result, indent=2))
        log(summary.format(**result))
        if args.json:
            print(json.dumps(result))
        return result

    if args.union_sweep:
        result = union_sweep(plan, (args.seq_len or [8192])[0], (args.topk or [512])[0], meter, log)
        result["break_even"] = {n: r["break_even_ratio"] for n, r in result["layouts"].items()}
        return special(result, "union", "break-even |union|/k: {break_even}")
    if args.crossover:
        plan.topks = tuple(args.topk or (256, 512))
        result = crossover(plan, (1.5, 2, 3, 4, 5, 6, 8, 12), meter, log)
        summary = f"crossover L/k: {{crossover_ratio}} (default in dsv32.dsa: {dsa.DENSE_CROSSOVER_RATIO})"
        return special(result, "crossover", summary)

    results: list[dict] = []
    grid = len(lengths) * len(topks) > 1
    for L in lengths:
        for r in measure_length(plan, L, meter, log):
            r["shape"] = asdict(shape)
            results.append(r)
            if args.json:
                print(json.dumps(r), flush=True)
            else:
                log(summarize(r))
        if grid:  # after every length, so that the lengths done survive a later one that fails
            partial = out_dir / "attention.json.part"
            partial.write_text(json.dumps(results, indent=2))
            partial.replace(out_dir / "attention.json")
    if not grid:
        r = results[0]
        (out_dir / f"attention_L{r['seq_len']}_k{r['topk']}.json").write_text(json.dumps(r, indent=2))
    else:
        plot(results, out_dir / "attention.png")
        log(f"wrote {out_dir / 'attention.json'} and {out_dir / 'attention.png'}")
        for r in results:
            log(summarize(r))
    return results


if __name__ == "__main__":
    main()
