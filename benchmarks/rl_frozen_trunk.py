"""One agentic GRPO update with the frozen lower layers run once per row, against the update whose every
forward runs every layer (``grpo_update(frozen_trunk=...)``).

SmolLM2-135M-Instruct (fp32) as the agentic post-training recipe trains it: the embeddings (tied to the
head) and the lowest 22 of 30 layers frozen, KL toward a copy of the starting model (β = 0.2), OPSM
(δ = 0.5), 2 mini-batches of micro-batches of 8. The batch is shaped like a step's episodes: ``--rows``
rows, each a prompt of 90–160 tokens, then three model calls of 40–110 tokens with a tool result of
15–40 tokens between them (not trained on); sampling log-probs are the model's own plus noise, so the
importance ratios, OPSM's mask and the KL term are not trivial. AdamW runs at lr 0, so both sides see
the same weights at every call. The two sides run interleaved (one warm-up each, then ``--reps``
blocks); they must give the same update: the log-probs from the trunk's states against the full
forward's, and the update's metrics, are compared.

    python benchmarks/rl_frozen_trunk.py [--rows 32] [--reps 2] [--quick]

Writes runs/bench/rl_frozen_trunk.json (same run, same machine).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
from pathlib import Path

import torch
from _timing import Meter, add_max_wait, interleaved, spread, wait_budget  # beside this script

from dsv32.rl.agentic.episodes import Row, rows_to_rollouts
from dsv32.rl.grpo.config import GRPOConfig
from dsv32.rl.grpo.policy import Policy, load_policy
from dsv32.rl.grpo.tasks import Task
from dsv32.rl.grpo.update import grpo_update
from dsv32.train.sft.model import freeze_lower_layers, vocab_matrices

FROZEN = 22


def episode_rows(n: int, vocab: int, g: torch.Generator) -> list[Row]:
    """``n`` rows shaped like the recipe's episodes (see the module docstring)."""
    rows = []
    for _ in range(n):
        prompt = torch.randint(100, vocab, (int(torch.randint(90, 161, (1,), generator=g)),), generator=g)
        tokens, actions = [], []
        for call in range(3):
            if call:
                result = int(torch.randint(15, 41, (1,), generator=g))
                tokens += torch.randint(100, vocab, (result,), generator=g).tolist()
                actions += [False] * result
            reply = int(torch.randint(40, 111, (1,), generator=g))
            tokens += torch.randint(100, vocab, (reply,), generator=g).tolist()
            actions += [True] * reply
        rows.append(Row(prompt.tolist(), tokens, actions, [0.0] * len(tokens)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="8 rows, one block")
    ap.add_argument("--out", default="runs/bench")
    add_max_wait(ap)
    args = ap.parse_args()
    if args.quick:
        args.rows, args.reps = 8, 1
    policy = load_policy("smollm2", device="cpu")
    freeze_lower_layers(policy.model, FROZEN)
    for p in vocab_matrices(policy.model):
        p.requires_grad_(False)
    ref = Policy(copy.deepcopy(policy.model).eval().requires_grad_(False), policy.tokenizer, policy.kind)
    g = torch.Generator().manual_seed(0)
    rows = episode_rows(args.rows, policy.model.config.vocab_size, g)
    tasks = [Task(id=f"t{i}", domain="toy", prompt="p") for i in range(args.rows)]
    batch = rows_to_rollouts(rows, tasks, policy.pad_token_id, "cpu", with_kept=False)
    every = torch.arange(args.rows)
    with torch.no_grad():
        full = policy.action_logprobs(**batch.rows(every))
        states = policy.trunk_states(batch.sequences, batch.attention_mask, batch.start, FROZEN)
        from_trunk = policy.action_logprobs(**batch.rows(every), trunk=(states, FROZEN))
    mask = batch.action_mask
    noise = 0.05 * torch.randn(full.shape, generator=g)
    batch.sampling_logprobs = torch.where(mask, full + noise, 0.0)
    advantages = torch.randn(args.rows, generator=g).sign()
    cfg = GRPOConfig(prompts_per_step=args.rows // 4, group_size=4, mini_batches=2, micro_batch=8,
                     kl_coef=0.2, opsm_delta=0.5, keep_routing=False)  # fmt: skip
    optimizer = torch.optim.AdamW([p for p in policy.model.parameters() if p.requires_grad], lr=0.0)

    def update(frozen_trunk: bool) -> list[dict]:
        return grpo_update(
            policy, optimizer, batch, advantages, cfg, temperature=0.8, ref=ref,
            generator=torch.Generator().manual_seed(0), frozen_trunk=frozen_trunk,
        )  # fmt: skip

    meter = Meter(max_wait=wait_budget(args))
    sides = {"every_layer": lambda: update(False), "frozen_trunk": lambda: update(True)}
    runs = interleaved(sides, args.reps, meter)
    a, b = runs.values["every_layer"][-1], runs.values["frozen_trunk"][-1]
    keys = ("pg_loss", "kl", "kl_loss", "opsm_masked_frac", "clip_frac", "grad_norm")
    result = {
        "model": "SmolLM2-135M-Instruct",
        "dtype": "float32",
        "frozen_layers": FROZEN,
        "layers": policy.model.config.num_hidden_layers,
        "rows": args.rows,
        "tokens": int(batch.attention_mask.sum()),
        "action_tokens": int(mask.sum()),
        "threads": torch.get_num_threads(),
        "max_abs_logprob_diff": float((from_trunk - full)[mask].abs().max()),
        "metrics": {k: {"every_layer": [r[k] for r in a], "frozen_trunk": [r[k] for r in b]} for k in keys},
        "every_layer_s": spread(runs.seconds["every_layer"]),
        "frozen_trunk_s": spread(runs.seconds["frozen_trunk"]),
        "speedup": statistics.median(runs.seconds["every_layer"])
        / statistics.median(runs.seconds["frozen_trunk"]),
        "contention": runs.contention(),
        **meter.facts(),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rl_frozen_trunk.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({k: result[k] for k in ("rows", "tokens", "max_abs_logprob_diff", "metrics", "speedup")},
                     indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
