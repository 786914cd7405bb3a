"""Greedy decoding in float32 and bfloat16 with the engine (``dsv32.engine.generate``) on
SmolLM2-135M-Instruct: output tokens per second at several batch sizes, and how many prompts decode
to the same tokens in both dtypes; first, this CPU's matmul throughput (``F.linear``) in each dtype at
SmolLM2's shapes (:data:`MATMULS`), by CPU time.

Prompts are ~``--prompt-len`` tokens of English text (the docstrings of standard-library modules,
cut to length), each row decodes ``--new-tokens`` tokens without stopping at the end token (as
``ignore_eos`` does), and a call's time includes its prefill. For every batch size the two dtypes run
interleaved (one warm-up each, then ``--reps`` blocks) in one process, so their ratio is measured
under the same load; the load average and others' share of the CPU are in the JSON. Beside the wall
time each call's CPU time (this process's user + system seconds) is recorded: with one thread
(``--threads 1``) it is the work the call did, which other processes on a busy machine slow down far
less than they slow its wall time.

Agreement: the rows of the largest batch, in each dtype (the same left-padded batch); a prompt agrees
when its tokens are identical. Where they differ, the float32 model is run on the prompt and the
common prefix alone, and the gap between its two logits at the first differing step (float32's choice
and bfloat16's) says whether that step was a near-tie.

    python benchmarks/engine_dtype.py [--batches 1 8 32] [--prompt-len 200] [--new-tokens 64] [--threads N]
                                      [--quick]

Writes runs/bench/engine_dtype.json; the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import statistics
import time
from pathlib import Path

import torch
from _timing import Meter, add_max_wait, interleaved, spread, wait_budget  # beside this script

from dsv32.engine import generate
from dsv32.engine.dtype import describe_bf16
from dsv32.engine.models import load_smollm2

MODULES = (
    "argparse", "json", "logging", "pathlib", "subprocess", "threading", "asyncio", "collections",
    "functools", "itertools", "statistics", "decimal", "fractions", "tarfile", "zipfile", "csv",
    "email", "http.client", "urllib.request", "unittest", "doctest", "pickle", "shelve", "sqlite3",
    "socket", "selectors", "heapq", "bisect", "textwrap", "string", "difflib", "calendar",
    "os", "re", "typing", "dataclasses", "enum", "inspect", "ast", "tokenize", "shutil", "tempfile",
    "random", "contextlib", "configparser", "optparse", "getopt", "pdb", "trace", "gettext", "locale",
)  # fmt: skip


def text_prompts(tokenizer, n: int, length: int) -> list[list[int]]:
    """``n`` prompts of ``length`` tokens: standard-library docstrings (doubled where too short)."""
    prompts = []
    for name in MODULES:
        doc = " ".join((importlib.import_module(name).__doc__ or "").split())
        ids = tokenizer.encode(doc)
        while ids and len(ids) < length:
            ids = ids + ids
        if len(ids) >= length:
            prompts.append(ids[:length])
        if len(prompts) == n:
            return prompts
    raise SystemExit(f"only {len(prompts)} standard-library docstrings reach {length} tokens")


#: (rows, in, out) of SmolLM2's matmuls: attention/MLP projections and the LM head, at 1 and 32 rows
MATMULS = ((1, 576, 1536), (32, 576, 1536), (32, 576, 49152), (1024, 1024, 1024))


def _linear_cpu_s(x: torch.Tensor, w: torch.Tensor, calls: int) -> float:
    """CPU seconds of ``calls`` ``F.linear(x, w)``."""
    start = time.process_time()
    for _ in range(calls):
        torch.nn.functional.linear(x, w)
    return time.process_time() - start


def matmuls(meter: Meter, reps: int) -> list[dict]:
    """``F.linear`` in each dtype at :data:`MATMULS` (interleaved), GFLOP/s by CPU time and wall time."""
    g = torch.Generator().manual_seed(0)
    rows = []
    for m, k, n in MATMULS:
        x, w = torch.randn(m, k, generator=g).bfloat16(), torch.randn(n, k, generator=g).bfloat16()
        calls = max(1, int(2e9 / (2 * m * k * n)))  # ~2 GFLOP per timing
        inputs = {"float32": (x.float(), w.float()), "bfloat16": (x, w)}
        sides = {name: functools.partial(_linear_cpu_s, *xw, calls) for name, xw in inputs.items()}
        runs = interleaved(sides, reps, meter)
        flop = 2 * m * k * n * calls
        cpu = {name: statistics.median(runs.values[name]) for name in sides}
        rows.append({
            "shape": [m, k, n],
            **{f"{name}_gflops_cpu": round(flop / cpu[name] / 1e9, 1) for name in sides},
            **{f"{name}_gflops_wall": round(flop / runs.median(name) / 1e9, 1) for name in sides},
            "cpu_ratio": round(cpu["float32"] / cpu["bfloat16"], 2),
        })  # fmt: skip
    return rows


def decode(model, prompts: list[list[int]], new_tokens: int) -> dict:
    """Greedy tokens of every row and the CPU seconds the call took."""
    start = time.process_time()
    out = generate(model, prompts, max_new_tokens=new_tokens, temperature=0.0, eos_token_id=[])
    return {"tokens": out.tokens.tolist(), "cpu_s": time.process_time() - start}


@torch.no_grad()
def first_step_gap(model32, prompt: list[int], a: list[int], b: list[int]) -> dict:
    """Where float32 tokens ``a`` and bfloat16 tokens ``b`` first differ, and float32's logit of its
    own choice minus its logit of bfloat16's there."""
    k = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    logits = model32(torch.tensor([prompt + a[:k]])).logits[0, -1].float()
    return {"step": k, "float32_logit_gap": float(logits[a[k]] - logits[b[k]])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="*", default=[1, 8, 32], help="none: the matmuls only")
    ap.add_argument("--prompt-len", type=int, default=200)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    ap.add_argument("--quick", action="store_true", help="batches 1 and 8, 16 new tokens, one block")
    ap.add_argument("--out", default="runs/bench")
    add_max_wait(ap)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.batches, args.new_tokens, args.reps = [1, 8], 16, 1
    models = {
        "float32": load_smollm2(torch.float32)[0].eval(),
        "bfloat16": load_smollm2(torch.bfloat16)[0].eval(),
    }
    tokenizer = load_smollm2()[1]
    prompts = text_prompts(tokenizer, max(args.batches, default=1), args.prompt_len)
    meter = Meter(max_wait=wait_budget(args))
    load_before = os.getloadavg()
    gemm = matmuls(meter, max(args.reps, 3))
    print(json.dumps(gemm))
    last = {"float32": [], "bfloat16": []}
    speed = {}
    for B in args.batches:
        rows = prompts[:B]
        sides = {
            name: (lambda m=m, rows=rows: decode(m, rows, args.new_tokens)) for name, m in models.items()
        }
        runs = interleaved(sides, args.reps, meter)
        tok_s = {name: B * args.new_tokens / runs.median(name) for name in sides}
        cpu = {name: statistics.median(v["cpu_s"] for v in runs.values[name]) for name in sides}
        speed[str(B)] = {
            "float32_tok_s": round(tok_s["float32"], 2),
            "bfloat16_tok_s": round(tok_s["bfloat16"], 2),
            "ratio": round(tok_s["bfloat16"] / tok_s["float32"], 3),
            "float32_tok_per_cpu_s": round(B * args.new_tokens / cpu["float32"], 2),
            "bfloat16_tok_per_cpu_s": round(B * args.new_tokens / cpu["bfloat16"], 2),
            "cpu_ratio": round(cpu["float32"] / cpu["bfloat16"], 3),
            "seconds": {name: spread(runs.seconds[name]) for name in sides},
            "contention": runs.contention(),
        }
        print(f"batch {B}: {json.dumps({k: v for k, v in speed[str(B)].items() if k.endswith(('s', 'o'))})}")
        last = {name: runs.values[name][-1]["tokens"] for name in sides}
    same, differ = 0, []
    for i, p in enumerate(prompts[: len(last["float32"])]):
        a, b = last["float32"][i], last["bfloat16"][i]
        if a == b:
            same += 1
        else:
            differ.append({"prompt": i, **first_step_gap(models["float32"], p, a, b)})
    gaps = [d["float32_logit_gap"] for d in differ]
    result = {
        "model": "SmolLM2-135M-Instruct",
        "cpu": describe_bf16(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "prompt_tokens": args.prompt_len,
        "new_tokens": args.new_tokens,
        "reps": args.reps,
        "matmuls": gemm,
        "speed": speed,
        "ratio_by_batch": {b: s["ratio"] for b, s in speed.items()},
        "cpu_ratio_by_batch": {b: s["cpu_ratio"] for b, s in speed.items()},
        "agreement": {
            "prompts": len(last["float32"]),
            "identical": same,
            "differ": differ,
            "median_gap_at_divergence": statistics.median(gaps) if gaps else None,
        },
        "load_average_before": [round(x, 2) for x in load_before],
        **meter.facts(),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "engine_dtype.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
