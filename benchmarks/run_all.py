"""`make bench`: run every benchmark script in benchmarks/ and record the headline tables in docs/results.md.

    python benchmarks/run_all.py                 # all scripts, their full default settings
    python benchmarks/run_all.py --quick         # pass --quick to every script (a few minutes)
    python benchmarks/run_all.py --only attention model_speed
    python benchmarks/run_all.py --max-wait 0    # scripts that wait for a quiet CPU never do
    python benchmarks/run_all.py --report-only   # no runs: the tables of the JSON already in runs/bench

    make bench BENCH_ARGS="--quick --out /tmp/bench --no-results"   # the same options through make

A script is any ``benchmarks/*.py`` but this one and names starting with ``_`` (``_timing.py``: the
timing the scripts share); new ones are picked up without editing this file (``--quick`` is passed
only to scripts whose source mentions it, ``--max-wait`` to those that call ``add_max_wait``). Each
script takes ``--out`` (a directory) and writes its JSON (and PNG) there: run_all's ``--out``, ``runs/bench/`` by default. One
failing script does not stop the others; the exit status is non-zero if any failed, and what a
failed script wrote before it failed still gets its table. A summary goes to ``<out>/run_all.json``.

Afterwards a dated section is appended to ``docs/results.md`` (``--results``; ``--no-results`` skips
it): the machine (CPU model from ``/proc/cpuinfo``, cores, the GPU if any), the torch version, the
date, the exact command, the commit (``git rev-parse --short HEAD``, marked when ``src/`` or
``benchmarks/`` have uncommitted changes) and one headline table per benchmark, read from the JSON it
wrote in this run (``<name>.json``; ``attention`` also its single-point files), each with its dtype. A
script without a table format here gets the top-level numbers of its ``<name>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def scripts() -> list[Path]:
    return sorted(
        p for p in HERE.glob("*.py") if p.name != Path(__file__).name and not p.name.startswith("_")
    )


def script_command(
    script: Path, quick: bool, out: str | None = None, max_wait: float | None = None
) -> list[str]:
    """The script's arguments, relative to the repository: ``--quick`` and ``--max-wait`` where asked
    and it takes them, ``--out`` (every script's output directory) where given."""
    source = script.read_text()
    return [
        str(script.relative_to(ROOT)),
        *(["--quick"] if quick and "--quick" in source else []),
        *(["--max-wait", f"{max_wait:g}"] if max_wait is not None and "add_max_wait(" in source else []),
        *(["--out", out] if out is not None else []),
    ]


def script_env() -> dict[str, str]:
    """The environment the scripts run in: this checkout's ``src`` first on ``PYTHONPATH``."""
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    )


# ------------------------------------------------------------------------------------------ the tables
def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])


def _s(v: float | None) -> str:
    return "—" if v is None else f"{v:.3g} s"


def _ms(v: float | None, scale: float = 1e3) -> str:
    return "—" if v is None else f"{v * scale:.3g} ms"


def _x(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}×"


def _mb(v: float | None) -> str:
    return "—" if v is None else f"{v:.0f} MB"


def _range(spread: dict | None) -> str:
    """A ``benchmarks/_timing.py`` spread of ratios as ``min–max×``."""
    return "—" if not spread or spread.get("min") is None else f"{spread['min']:.2f}–{spread['max']:.2f}×"


def _others(result: dict) -> str:
    """Others' share of the CPU while a row was measured (``benchmarks/_timing.py``'s ``contention``:
    the median of its repetition blocks, else over all of them)."""
    c = result.get("contention") or {}
    v = c.get("median_block") if c.get("median_block") is not None else c.get("overall")
    return "—" if v is None else f"{100 * v:.0f}%"


def attention_table(rows: list[dict] | dict) -> tuple[str, str]:
    """``attention.json`` (or one ``attention_L*_k*.json`` point): prefill and decode of ours against
    the dense baselines, per (L, k)."""
    rows = [rows] if isinstance(rows, dict) else rows
    dtypes = sorted({r.get("dtype", "float32") for r in rows})
    table = _table(
        ["L", "k", "prefill ours", "(a) flash SDPA", "ours vs (a)", "vs (a-math)", "vs (b) masked",
         "decode ours", "vs SDPA", "vs dense MLA", "peak prefill (ours)", "others' CPU"],
        [
            [
                str(r["seq_len"]), str(r["topk"]), _s(r["prefill_s"]["ours"]), _s(r["prefill_s"]["sdpa"]),
                _x(r["prefill_speedup_vs_sdpa"]), _x(r.get("prefill_speedup_vs_sdpa_math")),
                _x(r.get("prefill_speedup_vs_masked_dense")), _ms(r["decode_s_per_token"]["ours"]),
                _x(r["decode_speedup_vs_sdpa"]), _x(r["decode_speedup_vs_dense_mla"]),
                _mb(r["peak_mem_mb"].get("prefill.ours")), _others(r),
            ]
            for r in rows
        ],
    )  # fmt: skip
    return ", ".join(dtypes), table


def attention_gpu_table(result: dict) -> tuple[str, str]:
    """``attention_gpu.json``: the Triton kernels against flash SDPA and dense MLA decode."""
    rows = []
    for r in result["points"]:
        p, d = r["prefill_ms"], r["decode_ms"]
        rows.append(
            [
                str(result["heads"]), str(r["seq_len"]), str(r["topk"]), _ms(p["sdpa"], 1),
                f"{_ms(p['ours'], 1)} ({p['ours_indexer']:.3g} + {p['ours_attention']:.3g})",
                _x(r["prefill_speedup_vs_sdpa"]),
                f"{d['sdpa']:.3g} / {d['dense_mla']:.3g} / {d['ours']:.3g} ms",
            ]
        )  # fmt: skip
    header = ["heads", "L", "k", "prefill (a)", "prefill ours (indexer + attention)", "ratio",
              "decode (a) / dense MLA / ours"]  # fmt: skip
    return f"{result.get('dtype', 'bfloat16')} on {result.get('device', 'CUDA')}", _table(header, rows)


def model_speed_table(result: dict) -> tuple[str, str]:
    """``model_speed.json``: whole-model throughput, sparse (gather) against the masked reference."""
    g, m = result["gather"], result["masked"]
    table = _table(
        ["", "sparse (gather)", "masked-dense", "speed-up"],
        [
            ["prefill", f"{g['prefill_tokens_per_s']:.0f} tok/s", f"{m['prefill_tokens_per_s']:.0f} tok/s",
             _x(result["prefill_speedup"])],
            ["decode", f"{g['decode_tokens_per_s']:.3g} tok/s", f"{m['decode_tokens_per_s']:.3g} tok/s",
             _x(result["decode_speedup"])],
        ],
    )  # fmt: skip
    what = f"{result['layers']} layers, {result['seq_len']} tokens, index_topk {result['topk']}"
    if "reps" in result:
        what += (
            f"; medians of {result['reps']} interleaved repetitions, others used {_others(result)} of the CPU"
        )
    return f"float32; {what}", table


def keep_routing_table(result: dict) -> tuple[str, str]:
    """``rl_keep_routing.json``: the importance ratio with the recorded routing and the live router."""
    s = result["summary"]

    def pct(v: float) -> str:
        return f"{100 * v:.2g}%"

    table = _table(
        ["trained with", "mean abs log-ratio: recorded / live routing", "outside the clip range: recorded / live",
         "routing flips", "clipped while training"],
        [
            [name.replace("_", " "), f"{s[f'{name}.abs_log_ratio_kept']:.3g} / {s[f'{name}.abs_log_ratio_live']:.3g}",
             f"{pct(s[f'{name}.out_of_clip_kept'])} / {pct(s[f'{name}.out_of_clip_live'])}",
             pct(s[f"{name}.routing_flips"]), pct(s[f"{name}.clip_frac"])]
            for name in ("keep_routing", "live_routing")
        ],
    )  # fmt: skip
    what = f"{s['steps']} steps × {s['mini_batches']} mini-batches, experts ×{s['expert_scale']:g}"
    return f"float32; {what}", table


def rollout_scale_table(result: dict) -> tuple[str, str]:
    """``rollout_scale.json``: the remote engine with file weight sync, and env episodes on Ray."""
    r = result
    table = _table(
        ["measure", "value"],
        [
            ["on-policy max abs log-ratio, dsv32 serve smollm2 as engine (first update after a sync)",
             f"{r['remote_onpolicy_max_abs_log_ratio']:.3g} ({r['remote_onpolicy_tokens']} tokens)"],
            ["weight sync, SmolLM2 (write + /update_weights + version check)", _s(r["weight_sync_seconds"])],
            [f"engine − trainer weights after a sync, max abs ({r['weight_sync_keys']} keys, tied head kept: "
             f"{r['tied_head_kept']})", f"{r['weight_sync_max_abs_diff']:.3g}"],
            [f"{r['episodes']} code-interpreter episodes: serial / 4 Ray actors (0.5 CPU each)",
             f"{_s(r['serial_seconds'])} / {_s(r['ray_seconds'])} = {r['ray_episode_speedup']:.2f}×"],
            ["Ray local cluster start-up", _s(r["ray_startup_seconds"])],
            ["processes left running after shutdown", str(r["leftover_processes"])],
        ],
    )  # fmt: skip
    return f"float32, {r['cpus']} CPUs", table


def serve_soak_table(result: dict) -> tuple[str, str]:
    """``serve_soak.json``: ``dsv32 serve`` under a mixed load with weight updates between phases."""
    r = result
    mb = r["rss_slope_mb_per_min"]
    table = _table(
        ["measure", "value"],
        [
            ["requests (completed / cancelled or abandoned by the client)",
             f"{r['requests']} ({r['completed']} / {r['cancelled_by_client']})"],
            ["5xx: seen by the clients / counted by the server", f"{r['client_5xx']} / {r['server_5xx']}"],
            ["latency of completed requests, p50 / p99", f"{_s(r['latency_p50_s'])} / {_s(r['latency_p99_s'])}"],
            ["weight updates between phases (pause, resume, file sync) that failed",
             f"{sum('error' in u for u in r['weight_updates'])} of {len(r['weight_updates'])}"],
            ["server RSS: start / after the first phase / end / peak",
             " / ".join(_mb(r[k]) for k in ("rss_start_mb", "rss_after_first_phase_mb", "rss_end_mb", "rss_max_mb"))],
            ["server RSS slope after the first phase", "—" if mb is None else f"{mb:.2f} MB/min"],
            ["load average before / after (1 min)",
             f"{r['machine']['loadavg_before'][0]:.1f} / {r['machine']['loadavg_after'][0]:.1f}"],
        ],
    )  # fmt: skip
    what = f"{r['model']}, {r['seconds']:g} s, {r['clients']} clients, {r['machine']['cpus']} CPUs"
    return what, table


def rollout_prefix_table(result: dict) -> tuple[str, str]:
    """``rollout_prefix.json``: multi-turn batched sampling, every prompt prefilled vs prefix reuse."""
    r = result
    table = _table(
        ["episodes × calls", "prompt tokens", "prefilled with reuse", "full prefill", "prefix reuse",
         "speed-up", "same tokens", "others' CPU"],
        [[f"{r['episodes']} × {r['turns']}", str(r["prompt_tokens"]), str(r["prefilled_tokens_with_reuse"]),
          _s(r["full_prefill_s"]["median"]), _s(r["prefix_reuse_s"]["median"]), _x(r["speedup"]),
          str(r["same_tokens"]), _others(r)]],
    )  # fmt: skip
    return f"{r['dtype']}, {r['threads']} threads", table


def serve_prefix_table(result: dict) -> tuple[str, str]:
    """``serve_prefix.json``: ``dsv32 serve`` with and without its prefix cache, two agent workloads."""
    r = result
    rows = [
        [name, f"{r['tasks']} × {r['group']} × {r['turns']}", str(int(w["prompt_tokens"] or 0)),
         f"{w['hit_rate']:.2f}" if w["hit_rate"] is not None else "—", _s(w["no_cache_s"]["median"]),
         _s(w["cache_s"]["median"]), _x(w["speedup"]), str(w["same_tokens"]), _others(w)]
        for name, w in ((n, r[n]) for n in ("chat", "tokens"))
    ]  # fmt: skip
    header = ["workload", "tasks × group × turns", "prompt tokens", "hit rate", "no cache", "cache",
              "speed-up", "same tokens", "others' CPU"]  # fmt: skip
    return f"{r['dtype']}, {r['threads']} threads", _table(header, rows)


def rl_frozen_trunk_table(result: dict) -> tuple[str, str]:
    """``rl_frozen_trunk.json``: one GRPO update, every forward through every layer vs from the frozen
    trunk's states."""
    r = result
    table = _table(
        ["rows (tokens)", "frozen layers", "every layer", "frozen trunk once", "speed-up",
         "max abs Δ log-prob", "others' CPU"],
        [[f"{r['rows']} ({r['tokens']})", f"{r['frozen_layers']} of {r['layers']}", _s(r["every_layer_s"]["median"]),
          _s(r["frozen_trunk_s"]["median"]), _x(r["speedup"]), f"{r['max_abs_logprob_diff']:.1e}", _others(r)]],
    )  # fmt: skip
    return f"{r['dtype']}, {r['threads']} threads", table


def attention_gqa_table(result: dict) -> tuple[str, str]:
    """``attention_gqa.json``: the GQA layout's sparse attention, C kernel against torch and dense."""
    prefill = _table(
        ["prefill L (L/k)", "masked dense", "C kernel", "torch gather", "kernel vs torch", "kernel vs masked",
         "others' CPU"],
        [
            [f"{r['seq_len']} ({r['ratio']:g})", _ms(r["masked_dense_s"]), _ms(r["sparse_s"]), _ms(r["torch_s"]),
             _x(r["kernel_vs_torch"]), _x(r["kernel_vs_masked_dense"]), _others(r)]
            for r in result["prefill"]["rows"]
        ],
    )  # fmt: skip
    decode = _table(
        ["decode context", "dense SDPA", "C kernel", "torch gather", "kernel vs torch", "kernel vs SDPA",
         "others' CPU"],
        [
            [str(r["context"]), _ms(r["sdpa_us"], 1e-3), _ms(r["kernel_us"], 1e-3), _ms(r["torch_us"], 1e-3),
             _x(r["kernel_vs_torch"]), _x(r["kernel_vs_sdpa"]), _others(r)]
            for r in result["decode"]
        ],
    )  # fmt: skip
    s = result["shape"]
    what = (
        f"{s['heads']} heads / {s['kv_heads']} KV heads × {s['head_dim']}, k {s['topk']}; "
        f"prefill crossover L/k {result['prefill']['crossover_ratio']}"
    )
    return f"{result['dtype']}; {what}", f"{prefill}\n\n{decode}"


def hf_decode_table(result: dict) -> tuple[str, str]:
    """``hf_decode.json``: SmolLM2 decode per token, transformers' DynamicCache against GrowingCache."""
    table = _table(
        ["model", "context", "prefill", "decode: DynamicCache", "decode: GrowingCache", "speed-up",
         "speed-up of adjacent steps (min–max)", "K/V MB (Dynamic / Growing)", "same tokens", "others' CPU"],
        [
            [r["model"], str(r["context"]), _s(r["GrowingCache"]["prefill_s"]),
             _ms(r["DynamicCache"]["decode_ms_per_token"], 1), _ms(r["GrowingCache"]["decode_ms_per_token"], 1),
             _x(r["decode_speedup"]), _range(r.get("decode_speedup_per_step")),
             f"{r['DynamicCache']['cache_mb']:.0f} / {r['GrowingCache']['cache_mb']:.0f}",
             "yes" if r["same_tokens"] else "NO", _others(r)]
            for r in result["rows"]
        ],
    )  # fmt: skip
    interleaved = all("decode_speedup_per_step" in r for r in result["rows"])
    steps = f"median of {result['new_tokens']} {'interleaved ' if interleaved else ''}decode steps"
    what = f"{result['model']}, {result['threads']} threads, {steps}"
    return f"{result['dtype']}; {what}", table


def agent_loop_table(result: dict) -> tuple[str, str]:
    """``agent_loop.json``: the agent loop's overhead per step over a minimal loop, by episode length."""
    rows, names = result["rows"], list(result["overhead_ratio_200_vs_10"])
    table = _table(
        ["variant", *(f"overhead per step, {r['steps']} steps" for r in rows), "ratio 200 vs 10 steps"],
        [
            ["minimal loop (the baseline): time per step",
             *(f"{1e6 * r['baseline_s'] / r['steps']:.3g} µs" for r in rows), ""],
            *([name, *(f"{r[name]['overhead_per_step_us']:.3g} µs" for r in rows),
               _x(result["overhead_ratio_200_vs_10"][name])] for name in names),
        ],
    )  # fmt: skip
    return f"CPU time, medians of {result['repeats']} episodes", table


def _median_ms(d: dict) -> str:
    return f"{d['median_ms']:.3g} ms"


def envs_table(result: dict) -> tuple[str, str]:
    """``envs.json``: what confinement costs per call against the unconfined baseline, and episodes
    per minute."""
    box, kernel, general = result["sandbox"], result["kernel"], result["general"]
    rows = []
    for name, what in (("true", "start `true`"), ("python", "start `python -c pass`")):
        base = box[f"baseline_{name}"]
        for kind in ("bwrap", "unshare", "rlimits"):
            if f"{kind}_{name}" in box:
                mine = box[f"{kind}_{name}"]
                rows.append([f"{what}, {kind}", _median_ms(mine), f"{_median_ms(base)} (subprocess)",
                             _x(mine["median_ms"] / base["median_ms"])])  # fmt: skip
    rows += [
        ["Jupyter kernel start", f"{kernel['sandboxed_start_ms']:.3g} ms", f"{kernel['baseline_start_ms']:.3g} ms",
         _x(kernel["sandboxed_start_ms"] / kernel["baseline_start_ms"])],
        ["kernel cell round trip", _median_ms(kernel["sandboxed_round_trip"]), _median_ms(kernel["baseline_round_trip"]),
         _x(kernel["sandboxed_round_trip"]["median_ms"] / kernel["baseline_round_trip"]["median_ms"])],
        ["general-tools call", _median_ms(general["sandboxed_call"]),
         f"{_median_ms(general['baseline_in_process'])} (in-process)",
         _x(general["sandboxed_call"]["median_ms"] / general["baseline_in_process"]["median_ms"])],
    ]  # fmt: skip
    if "kernel_starts" in result:  # the start turn released at the first answer vs held to readiness
        starts = result["kernel_starts"]
        rows.append([f"{starts['kernels']} kernel starts at once (turn released at the first answer)",
                     f"{starts['released_at_answer_s']:.3g} s", f"{starts['held_to_ready_s']:.3g} s (turn held to readiness)",
                     _x(starts["released_at_answer_s"] / starts["held_to_ready_s"])])  # fmt: skip
    overhead = _table(["what", "sandboxed (median)", "baseline (median)", "ratio"], rows)
    envs = sorted({k.split("/")[0] for k in result["episodes"]})
    rates = _table(
        ["episodes per minute", *(f"{p} in parallel" for p in (1, 2, 4))],
        [[env, *(f"{result['episodes'][f'{env}/parallel={p}']['episodes_per_minute']:.3g}" for p in (1, 2, 4))]
         for env in envs],
    )  # fmt: skip
    load = result.get("load_average_before")
    what = f"isolation {result['isolation']}" + (f"; load average {load[0]:.1f} at the start" if load else "")
    return what, f"{overhead}\n\n{rates}"


def envs_search_swe_table(result: dict) -> tuple[str, str]:
    """``envs_search_swe.json``: BM25 against a scan, SWE suites with and without the sandbox, and
    episodes per minute."""
    search, swe = result["search"], result["swe"]
    same = search.get("search_bm25_scan_queries", search["search_bm25"])
    rows = [[f"search (BM25 vs a scan), {same['n']} queries", _median_ms(same),
             _median_ms(search["search_scan_baseline"]), _x(search["bm25_speedup_vs_scan"])]]  # fmt: skip
    for spec, r in swe["suite_run"].items():
        rows.append([f"`{spec}` suite ({r['tests']} tests), sandboxed vs plain pytest", _s(r["sandboxed_s"]),
                     _s(r["plain_s"]), _x(r["sandboxed_s"] / r["plain_s"])])  # fmt: skip
    costs = _table(["what", "ours (median)", "baseline (median)", "ratio"], rows)
    rates = _table(
        ["episodes per minute", *(f"{r['parallel']} in parallel" for r in swe["episodes"])],
        [[name, *(f"{r['episodes_per_min']:.3g}" for r in part["episodes"])]
         for name, part in (("search", search), ("swe", swe))],
    )  # fmt: skip
    return f"sandbox {result['machine'].get('sandbox')}", f"{costs}\n\n{rates}"


def serve_load_table(result: dict) -> tuple[str, str]:
    """``serve_load.json``: output tokens/s of each server by concurrency, against its own at 1 client."""
    rows = []
    for label, settings in result["settings"].items():
        base = next((r for r in settings if r["clients"] == 1 and "skipped" not in r), None)
        for r in settings:
            if "skipped" in r:
                rows.append([str(r["clients"]), label, f"skipped ({r['skipped']})", "", "", "", ""])
                continue
            ratio = r["output_tokens_per_s"] / base["output_tokens_per_s"] if base else None
            rows.append([str(r["clients"]), label, str(r["errors"]), f"{r['output_tokens_per_s']:.3g}", _x(ratio),
                         f"{r['latency_p50_s']:.2g} / {r['latency_p95_s']:.2g}",
                         f"{r['mean_batch_size']:.1f}"])  # fmt: skip
    table = _table(
        [
            "clients",
            "server",
            "errors",
            "output tok/s",
            "vs 1 client",
            "latency p50 / p95 (s)",
            "mean decode batch",
        ],
        sorted(rows, key=lambda r: int(r[0])),
    )
    what = (
        f"{result['model']}; per client {result['requests_per_client']} × {result['max_tokens']}-token requests; "
        f"continuous / one at a time at 16 clients: {_x(result['ratio_at_16'])}"
    )
    return what, table


def constraint_mask_table(result: dict) -> tuple[str, str]:
    """``constraint_mask.json``: the grammar mask per step and a decode with and without a grammar."""
    steps = result["per_step"]
    rows = [[name, f"{s['steps']}", f"{s['mask_us']:.3g}", f"{s['mask_p90_us']:.3g}", f"{s['advance_us']:.3g}"]
            for name, s in steps.items()]  # fmt: skip
    decode = result["decode"]
    what = (
        f"vocabulary {result['vocab_size']} tokens built in {result['vocabulary_s']:.2g} s; decode "
        f"{decode['free_ms_per_token']:.4g} / {decode['constrained_ms_per_token']:.4g} ms per token free / "
        f"constrained; others {result['per_step_others']}"
    )
    return what, _table(["grammar", "steps", "mask median (µs)", "mask p90 (µs)", "advance (µs)"], rows)


def interop_table(result: dict) -> tuple[str, str]:
    """``interop.json``: the OpenEnv / verifiers reference rewards and LoRA against full fine-tuning."""
    r = result
    mem, sec = r["lora_recipe"]["memory"], r["lora_recipe"]["seconds"]

    def reward(key: str) -> str:
        return f"{r[key]} (wrong answer: {r[key.replace('reference', 'wrong').replace('adapter', 'adapter_wrong')]})"

    rows = [
        ["OpenEnv: openenv-core's client → `dsv32 envs serve code-interpreter`", reward("openenv_reference_reward")],
        ["OpenEnv: an openenv-core server in dsv32's agent loop", reward("openenv_adapter_reward")],
        ["verifiers: the `dsv32-envs` taskset's rubric", reward("verifiers_reference_reward")],
        ["GRPO update, full / LoRA (medians, interleaved)", f"{_s(sec['full_update_s']['median'])} / "
         f"{_s(sec['lora_update_s']['median'])} = {_x(r['lora_update_speedup'])}; others' CPU {_others(sec)}"],
        ["peak RSS during the update, LoRA / full", f"{_mb(mem['lora']['peak_rss_mb'])} / "
         f"{_mb(mem['full']['peak_rss_mb'])} = {r['lora_peak_memory_ratio']:.2f}"],
        ["on-policy max abs log-ratio with LoRA", f"{r['lora_onpolicy_max_abs_log_ratio']:.2g} "
         f"({r['lora_onpolicy_tokens']} tokens)"],
    ]  # fmt: skip
    what = (
        f"{r['dtype']}; {r['model']}, {r['rows']} rows, {r['frozen_layers']} frozen layers, LoRA rank {r['rank']}; "
        f"load average {r['load_average_start']} → {r['load_average_end']}"
    )
    return what, _table(["measure", "value"], rows)


def engine_dtype_table(result: dict) -> tuple[str, str]:
    """``engine_dtype.json``: greedy decode in fp32 and bf16 by batch (wall and this process's CPU time)."""
    rows = [[b, f"{s['float32_tok_s']:.3g}", f"{s['bfloat16_tok_s']:.3g}", _x(s["ratio"]), _x(s["cpu_ratio"])]
            for b, s in result["speed"].items()]  # fmt: skip
    agree = result["agreement"]
    what = (
        f"{result['model']}, {result['threads']} thread(s), {result['prompt_tokens']}-token prompts, "
        f"{result['new_tokens']} new tokens; greedy outputs identical in {agree['identical']} of "
        f"{agree['prompts']} prompts"
    )
    return what, _table(["batch", "fp32 tok/s", "bf16 tok/s", "bf16 / fp32", "by CPU time"], rows)


def engine_vs_vllm_table(result: dict) -> tuple[str, str]:
    """``engine_vs_vllm.json``: dsv32 serve and vLLM, output tokens/s by workload and dtype."""
    rows = []
    for dtype, workloads in result["tok_s"].items():
        for workload, speed in workloads.items():
            label = workload if workload == "agentic" else f"{workload} clients"
            ours, theirs = speed["dsv32"], speed["vllm"]
            shown = [f"{v:.1f}" if v else "—" for v in (ours, theirs)]
            rows.append([dtype, label, *shown, _x(ours / theirs) if ours and theirs else "—"])
    fraction = result.get("decode_flops_fraction_bf16")
    what = (
        f"{result['model']}, {result['threads']} threads, {result['prompt_tokens']}-token prompts, "
        f"{result['new_tokens']} new tokens (ignore_eos, greedy)"
        + (f"; bf16 decode at 32 rows reaches {fraction:.0%} of the matmuls' FLOP/s" if fraction else "")
    )
    return what, _table(["dtype", "workload", "dsv32 tok/s", "vLLM tok/s", "dsv32 / vLLM"], rows)


def rl_bf16_ratio_table(result: dict) -> tuple[str, str]:
    """``rl_bf16_ratio.json``: the first update's |log ratio| of the fp32 trainer against each engine dtype."""
    rows = []
    for name, sides in result.items():
        if not isinstance(sides, dict):
            continue
        for side, r in sides.items():
            rows.append([name, side, f"{r['max_abs_log_ratio']:.2g}", f"{r['mean_abs_log_ratio']:.2g}",
                         f"{r['p99_abs_log_ratio']:.2g}", str(r["tokens"])])  # fmt: skip
    what = f"group {result['group']}, {result['new_tokens']} new tokens, temperature {result['temperature']}"
    return what, _table(["policy", "engine", "max", "mean", "p99", "tokens"], rows)


def scalar_table(result: object) -> tuple[str, str]:
    """Any other JSON object: its top-level numbers."""
    items = result.items() if isinstance(result, dict) else []
    rows = [[k, f"{v:.4g}"] for k, v in items if isinstance(v, int | float) and not isinstance(v, bool)]
    return "see the JSON", _table(["key", "value"], rows or [["(no top-level numbers)", ""]])


# script stem → (its JSON files, how to read them into a table); attention's sweeps (crossover, union,
# tune) have other shapes and no table here
FORMATS: dict[str, tuple[tuple[str, ...], Callable]] = {
    "attention": (("attention.json", "attention_L*_k*.json"), attention_table),
    "attention_gpu": (("attention_gpu.json",), attention_gpu_table),
    "model_speed": (("model_speed.json",), model_speed_table),
    "hf_decode": (("hf_decode.json",), hf_decode_table),
    "attention_gqa": (("attention_gqa.json",), attention_gqa_table),
    "rl_keep_routing": (("rl_keep_routing.json",), keep_routing_table),
    "agent_loop": (("agent_loop.json",), agent_loop_table),
    "envs": (("envs.json",), envs_table),
    "envs_search_swe": (("envs_search_swe.json",), envs_search_swe_table),
    "serve_load": (("serve_load.json",), serve_load_table),
    "serve_soak": (("serve_soak.json",), serve_soak_table),
    "rollout_scale": (("rollout_scale.json",), rollout_scale_table),
    "rollout_prefix": (("rollout_prefix.json",), rollout_prefix_table),
    "serve_prefix": (("serve_prefix.json",), serve_prefix_table),
    "rl_frozen_trunk": (("rl_frozen_trunk.json",), rl_frozen_trunk_table),
    "rl_keep_indexing": (("rl_keep_indexing.json",), scalar_table),
    "constraint_mask": (("constraint_mask.json",), constraint_mask_table),
    "interop": (("interop.json",), interop_table),
    "engine_dtype": (("engine_dtype.json",), engine_dtype_table),
    "engine_vs_vllm": (("engine_vs_vllm.json",), engine_vs_vllm_table),
    "rl_bf16_ratio": (("rl_bf16_ratio.json",), rl_bf16_ratio_table),
}


def benchmark_section(stem: str, out: Path, since: float) -> str | None:
    """The Markdown of one benchmark's JSON under ``out`` written at or after ``since`` (None when it
    wrote none, e.g. the GPU benchmark on a machine without a GPU)."""
    patterns, fmt = FORMATS.get(stem, ((f"{stem}.json",), scalar_table))
    files = sorted(p for pattern in patterns for p in out.glob(pattern) if p.stat().st_mtime >= since)
    if not files:
        return None
    parts = []
    for path in files:
        dtype, table = fmt(json.loads(path.read_text()))
        parts.append(
            f"`{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}` ({dtype}):\n\n{table}"
        )
    return "\n\n".join(parts)


# ----------------------------------------------------------------------------------- the run's facts
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def torch_facts() -> tuple[str, str | None]:
    """The torch version and the CUDA device's name (None without one)."""
    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return torch.__version__, gpu


def git_commit() -> str:
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)

    head = git("rev-parse", "--short", "HEAD")
    if head.returncode != 0:
        return "unknown (not a git checkout)"
    dirty = git("status", "--porcelain", "--", "src", "benchmarks").stdout.strip()
    return head.stdout.strip() + (" with uncommitted changes in src/ or benchmarks/" if dirty else "")


def results_section(command: str, summary: list[dict], out: Path, since: float) -> str:
    """The dated section ``make bench`` appends to docs/results.md (``since`` 0: a report of the JSON
    already in ``out``, whose runs this section did not see)."""
    version, gpu = torch_facts()
    shown = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"## `make bench` — {now}",
        "",
        f"- Machine: {cpu_model()}, {os.cpu_count()} cores" + (f"; GPU: {gpu}" if gpu else "; no GPU"),
        f"- torch {version}; Python {platform.python_version()}",
        f"- Command: `{command}`",
        f"- Commit: `{git_commit()}`",
    ]
    if not since:
        lines.append(
            f"- Tables from the JSON already in `{shown}`: the machine, torch and commit above are this "
            "report's; check that they are the runs' too."
        )
    for s in summary:
        stem = Path(s["script"]).stem
        lines += ["", f"### {s['script']}"]
        if s["seconds"] is not None:
            lines += ["", f"`{shlex.join(['python', *s['command']])}` · {s['seconds']:.0f} s"]
        body = benchmark_section(stem, out, since)
        if s["returncode"] != 0:
            failed = f"Failed (exit {s['returncode']})"
            lines += [
                "",
                f"{failed}; what it wrote before it failed:\n\n{body}" if body else f"{failed}; no table.",
            ]
            continue
        missing = (
            "Wrote no JSON in this run (e.g. no GPU on this machine)." if since else f"No JSON in `{shown}`."
        )
        lines += ["", body or missing]
    return "\n".join(lines) + "\n"


def append_results(path: Path, section: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = path.read_text() if path.exists() else "# Results\n"
    path.write_text(text.rstrip("\n") + "\n\n" + section)


# ------------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="pass --quick to the scripts that support it")
    ap.add_argument("--only", nargs="+", default=None, help="script names (without .py) to run")
    ap.add_argument(
        "--max-wait",
        type=float,
        default=None,
        help="seconds each script that takes --max-wait may wait in all for a quiet CPU (0: never)",
    )
    ap.add_argument("--out", default="runs/bench", help="where the scripts' JSON and the summary are")
    ap.add_argument("--results", default="docs/results.md", help="the Markdown file the tables go to")
    ap.add_argument("--no-results", action="store_true", help="do not append to --results")
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: append the tables of the JSON already in --out",
    )
    args = ap.parse_args(argv)

    todo = [p for p in scripts() if args.only is None or p.stem in args.only]
    if args.only:
        missing = set(args.only) - {p.stem for p in todo}
        if missing:
            ap.error(f"no benchmark script named {sorted(missing)}; have {[p.stem for p in scripts()]}")
    out = ROOT / args.out
    env = script_env()
    since = 0.0 if args.report_only else time.time()
    summary = []
    for script in todo:
        cmd = script_command(script, args.quick, args.out, args.max_wait)
        if args.report_only:
            summary.append({"script": script.name, "command": cmd, "returncode": 0, "seconds": None})
            continue
        print(f"=== {script.name}: {' '.join(cmd)}", flush=True)
        start = time.perf_counter()
        rc = subprocess.call([sys.executable, *cmd], cwd=ROOT, env=env)
        elapsed = time.perf_counter() - start
        summary.append(
            {"script": script.name, "command": cmd, "returncode": rc, "seconds": round(elapsed, 1)}
        )
        print(
            f"=== {script.name}: {'ok' if rc == 0 else f'FAILED (exit {rc})'} in {elapsed:.0f} s", flush=True
        )
    out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        (out / "run_all.json").write_text(json.dumps(summary, indent=2))
    if not args.no_results:
        section = results_section(shlex.join(["python", "benchmarks/run_all.py", *argv]), summary, out, since)
        append_results(ROOT / args.results, section)
        print(f"appended the tables to {args.results}", flush=True)
    failed = [s["script"] for s in summary if s["returncode"] != 0]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
