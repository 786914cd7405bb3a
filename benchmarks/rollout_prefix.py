"""Multi-turn batched sampling with and without prefix reuse (``dsv32.engine.prefix.PrefixCache``).

SmolLM2-135M-Instruct (fp32). A rollout here is what GRPO's lockstep batcher asks of the engine for
``--tasks`` tasks × ``--group`` episodes: ``--turns`` batched ``generate`` calls (temperature 0.8,
top-p 0.95, a generator per group, kept sets recorded), each next prompt the previous prompt, the
sampled reply and a tool result of 12–30 tokens; the G episodes of a task share their first prompt.
The two sides — every call prefilling its whole prompts, and one ``PrefixCache`` across the calls —
run interleaved (one warm-up each, then ``--reps`` blocks), and must sample the same tokens.

    python benchmarks/rollout_prefix.py [--tasks 8] [--group 4] [--turns 3] [--new-tokens 48] [--quick]

Writes runs/bench/rollout_prefix.json (same run, same machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from _timing import Meter, add_max_wait, interleaved, spread, wait_budget  # beside this script

from dsv32.engine import generate
from dsv32.engine.models import load_smollm2
from dsv32.engine.prefix import PrefixCache


def rollout(model, tokenizer, args, prefix: PrefixCache | None) -> dict:
    """The calls of one batch of episodes; their tokens, per-call seconds and prompt tokens."""
    g = torch.Generator().manual_seed(0)
    prompts = []
    for t in range(args.tasks):
        text = " ".join(chr(97 + int(i)) for i in torch.randint(26, (40 + 7 * t,), generator=g))
        prompts += [tokenizer.encode(f"Task {t}: {text}")] * args.group
    tokens, seconds, prompt_tokens = [], [], []
    for turn in range(args.turns):
        groups = [torch.Generator().manual_seed(1000 * turn + t) for t in range(args.tasks)]
        gens = [groups[i // args.group] for i in range(len(prompts))]  # a group shares one generator
        start = time.perf_counter()
        out = generate(
            model, prompts, max_new_tokens=args.new_tokens, temperature=0.8, top_p=0.95,
            eos_token_id=tokenizer.eos_token_id, generator=gens, return_kept=True, prefix=prefix,
        )  # fmt: skip
        seconds.append(time.perf_counter() - start)
        prompt_tokens.append(sum(len(p) for p in prompts))
        replies = [out.tokens[i, : out.lengths[i]].tolist() for i in range(len(prompts))]
        tokens.append(replies)
        result = [tokenizer.encode(f" result {i}: " + "7" * (4 + 3 * (i % 7))) for i in range(len(prompts))]
        prompts = [p + r + x for p, r, x in zip(prompts, replies, result)]
    return {
        "tokens": tokens,
        "seconds": seconds,
        "prompt_tokens": prompt_tokens,
        "prefilled": None if prefix is None else prefix.prefilled_tokens,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="4 tasks, 24 new tokens, one block")
    ap.add_argument("--out", default="runs/bench")
    add_max_wait(ap)
    args = ap.parse_args()
    if args.quick:
        args.tasks, args.new_tokens, args.reps = 4, 24, 1
    model, tokenizer = load_smollm2()
    model.eval()
    meter = Meter(max_wait=wait_budget(args))
    sides = {
        "full_prefill": lambda: rollout(model, tokenizer, args, None),
        "prefix_reuse": lambda: rollout(model, tokenizer, args, PrefixCache()),
    }
    runs = interleaved(sides, args.reps, meter)
    full, reuse = runs.values["full_prefill"][-1], runs.values["prefix_reuse"][-1]
    result = {
        "model": "SmolLM2-135M-Instruct",
        "dtype": "float32",
        "episodes": args.tasks * args.group,
        "tasks": args.tasks,
        "group": args.group,
        "turns": args.turns,
        "new_tokens": args.new_tokens,
        "threads": torch.get_num_threads(),
        "prompt_tokens": sum(full["prompt_tokens"]),
        "prefilled_tokens_with_reuse": reuse["prefilled"],
        "same_tokens": all(v["tokens"] == full["tokens"] for v in runs.values["prefix_reuse"]),
        "full_prefill_s": spread(runs.seconds["full_prefill"]),
        "prefix_reuse_s": spread(runs.seconds["prefix_reuse"]),
        "per_call_s": {name: [round(s, 2) for s in runs.values[name][-1]["seconds"]] for name in sides},
        "speedup": statistics.median(runs.seconds["full_prefill"])
        / statistics.median(runs.seconds["prefix_reuse"]),
        "contention": runs.contention(),
        **meter.facts(),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rollout_prefix.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({k: result[k] for k in ("episodes", "prompt_tokens", "prefilled_tokens_with_reuse",
                                              "same_tokens", "per_call_s", "speedup")}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
