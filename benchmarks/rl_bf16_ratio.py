"""The first GRPO update's log ratio with bf16 rollouts and an fp32 (or bf16 mixed-precision) trainer.

For each policy, a rollout batch is sampled by the in-process engine in float32 (the trainer's own
model) and in bfloat16 (its bf16 copy, ``[engine] dtype = "bfloat16"``), with the same seed, top-p and
the recorded kept sets; the fp32 trainer's log-probs of the sampled tokens, renormalized over those
kept sets (what the first, on-policy update computes before any step), are compared with the
engine's sampling log-probs: max and mean |log π_θ − log π_old| over the action tokens.

Policies: SmolLM2-135M-Instruct on the arithmetic word problems of ``configs/rl-smollm2-arith.toml``
(temperature 0.8, top-p 0.95), and the tiny random Llama and V3.2 of the tests on short prompts (the
V3.2 also with Keep Routing and Keep Indexing: the trainer replays the bf16 engine's expert choices and
indexer selections). ``bfloat16_trainer``: bf16 rollouts against the trainer's forward under bf16
autocast (``[policy] dtype = "bfloat16"``, the weights fp32).

    python benchmarks/rl_bf16_ratio.py [--prompts 4] [--group 8] [--new-tokens 64] [--quick]

Writes runs/bench/rl_bf16_ratio.json; the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from dsv32.rl.engines import InProcessEngine
from dsv32.rl.grpo.policy import load_policy, with_precision
from dsv32.rl.grpo.rollout import SamplingConfig, rollout
from dsv32.rl.grpo.tasks import ArithmeticWordProblems, Task


def tasks_for(name: str, n: int) -> list[Task]:
    if name == "smollm2":
        source = ArithmeticWordProblems(kinds=("add", "sub"), max_operand=20, template="brief")
        return [source.get(i) for i in range(n)]
    return [Task(id=f"t{i}", domain="toy", prompt=p) for i, p in enumerate(["ab", "xyz", "hello", "q"][:n])]


@torch.no_grad()
def log_ratios(
    policy, tasks: list[Task], args, dtype: str, replay: bool = False, trainer_dtype: str = "float32"
) -> dict:
    """Max and mean |log ratio| of the ``trainer_dtype`` trainer against the ``dtype`` engine over one
    batch; ``replay``: the trainer replays the engine's expert choices and indexer selections (Keep
    Routing, Keep Indexing; the native model)."""
    engine = InProcessEngine(policy.model, dtype=dtype)
    params = SamplingConfig(temperature=0.8, top_p=0.95, max_new_tokens=args.new_tokens)
    batch = rollout(
        policy, tasks, args.group, params, generator=torch.Generator().manual_seed(0), engine=engine,
        keep_routing=replay, keep_indexing=replay,
    )  # fmt: skip
    trainer = with_precision(policy, trainer_dtype).action_logprobs(
        **batch.rows(torch.arange(len(batch))), temperature=0.8
    )
    diff = (trainer - batch.sampling_logprobs)[batch.action_mask].abs()
    return {
        "tokens": int(diff.numel()),
        "max_abs_log_ratio": float(diff.max()),
        "mean_abs_log_ratio": float(diff.mean()),
        "p99_abs_log_ratio": float(diff.quantile(0.99)),
        "kept_set_mean": float((batch.kept_ids >= 0).sum(-1)[batch.action_mask].float().mean()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--policies", nargs="+", default=["smollm2", "tiny-llama", "tiny-native"])
    ap.add_argument("--quick", action="store_true", help="2 prompts × 4, 24 new tokens")
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args()
    if args.quick:
        args.prompts, args.group, args.new_tokens = 2, 4, 24
    result = {"group": args.group, "new_tokens": args.new_tokens, "temperature": 0.8, "top_p": 0.95}
    for name in args.policies:
        policy = load_policy(name, device="cpu")
        tasks = tasks_for(name, args.prompts)
        result[name] = {dtype: log_ratios(policy, tasks, args, dtype) for dtype in ("float32", "bfloat16")}
        result[name]["bfloat16_trainer"] = log_ratios(
            policy, tasks, args, "bfloat16", trainer_dtype="bfloat16"
        )
        if policy.kind == "native":
            result[name]["bfloat16_replayed"] = log_ratios(policy, tasks, args, "bfloat16", replay=True)
        print(name, json.dumps(result[name]))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rl_bf16_ratio.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
