"""Greedy decoding in float32 and bfloat16 with the engine (``dsv32.engine.generate``) on
SmolLM2-135M-Instruct: output tokens per second at several batch sizes, and how many prompts decode
to the same tokens in both dtypes.

Prompts are ~``--prompt-len`` tokens of English text (the docstrings of standard-library modules,
cut to length), each row decodes ``--new-tokens`` tokens without stopping at the end token (as
``ignore_eos`` does), and a call's time includes its prefill. For every batch size the two dtypes run
interleaved (one warm-up each, then ``--reps`` blocks) in one process, so their ratio is measured
under the same load; the load average and others' share of the CPU are in the JSON.

Agreement: the ``--agree`` prompts decoded one at a time in each dtype (no padding); a prompt agrees
when its tokens are identical. Where they differ, the float32 model is run on the common prefix and
the gap between its two logits at the first differing step (float32's choice and bfloat16's) says
whether that step was a near-tie.

    python benchmarks/engine_dtype.py [--batches 1 8 32] [--prompt-len 200] [--new-tokens 64] [--threads N]
                                      [--quick]

Writes runs/bench/engine_dtype.json; the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
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


def decode(model, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    out = generate(model, prompts, max_new_tokens=new_tokens, temperature=0.0, eos_token_id=[])
    return out.tokens.tolist()


@torch.no_grad()
def first_step_gap(model32, prompt: list[int], a: list[int], b: list[int]) -> dict:
    """Where float32 tokens ``a`` and bfloat16 tokens ``b`` first differ, and float32's logit of its
    own choice minus its logit of bfloat16's there."""
    k = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    logits = model32(torch.tensor([prompt + a[:k]])).logits[0, -1].float()
    return {"step": k, "float32_logit_gap": float(logits[a[k]] - logits[b[k]])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--prompt-len", type=int, default=200)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--agree", type=int, default=32, help="prompts decoded one at a time for agreement")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    ap.add_argument("--quick", action="store_true", help="batches 1 and 8, 16 new tokens, one block")
    ap.add_argument("--out", default="runs/bench")
    add_max_wait(ap)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.batches, args.new_tokens, args.reps, args.agree = [1, 8], 16, 1, 8
    models = {
        "float32": load_smollm2(torch.float32)[0].eval(),
        "bfloat16": load_smollm2(torch.bfloat16)[0].eval(),
    }
    tokenizer = load_smollm2()[1]
    prompts = text_prompts(tokenizer, max(max(args.batches), args.agree), args.prompt_len)
    meter = Meter(max_wait=wait_budget(args))
    load_before = os.getloadavg()
    speed = {}
    for B in args.batches:
        rows = prompts[:B]
        sides = {
            name: (lambda m=m, rows=rows: decode(m, rows, args.new_tokens)) for name, m in models.items()
        }
        runs = interleaved(sides, args.reps, meter)
        tok_s = {name: B * args.new_tokens / runs.median(name) for name in sides}
        speed[str(B)] = {
            "float32_tok_s": round(tok_s["float32"], 2),
            "bfloat16_tok_s": round(tok_s["bfloat16"], 2),
            "ratio": round(tok_s["bfloat16"] / tok_s["float32"], 3),
            "seconds": {name: spread(runs.seconds[name]) for name in sides},
            "contention": runs.contention(),
        }
        print(f"batch {B}: {json.dumps({k: v for k, v in speed[str(B)].items() if k.endswith(('s', 'o'))})}")
    same, differ = 0, []
    for i, p in enumerate(prompts[: args.agree]):
        a, b = (decode(models[name], [p], args.new_tokens)[0] for name in ("float32", "bfloat16"))
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
        "speed": speed,
        "ratio_by_batch": {b: s["ratio"] for b, s in speed.items()},
        "agreement": {
            "prompts": args.agree,
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
