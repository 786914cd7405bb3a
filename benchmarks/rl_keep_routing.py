"""Keep Routing's effect on the training/inference ratio (paper §3.1), on a tiny random MoE.

Two GRPO runs from the same initialization, seeds and data — one replaying the experts recorded at
sampling time in the training forward (Keep Routing), one letting the live router choose. Each rollout
batch is split into several mini-batches, so later updates run off-policy and the router drifts.
Per step we record, over the off-policy mini-batches: mean |log π_θ − log π_old| of the sampled tokens,
the clipped-token fraction, and the share of (token, MoE layer) routing decisions that the live router
would now make differently from the rollout (flips). Without Keep Routing those flips land directly in
the ratio; with it the training forward uses the same experts the sample was drawn with.

    python benchmarks/rl_keep_routing.py [--steps 30] [--quick]

Writes ``runs/bench/rl_keep_routing.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from dsv32.rl.config import GRPOConfig
from dsv32.rl.loss import group_advantages
from dsv32.rl.policy import load_policy
from dsv32.rl.rollout import SamplingConfig, rollout
from dsv32.rl.tasks import Task
from dsv32.rl.trainer import grpo_update

PROMPTS = ["ab", "xyz", "hello", "q", "rl", "moe", "keep", "route"]


def letter_reward(text: str) -> float:
    """Share of the first 8 characters that are lowercase ASCII letters."""
    return sum("a" <= ch <= "z" for ch in text[:8]) / 8


@torch.no_grad()
def flip_fraction(policy, batch) -> float:
    """Share of (MoE layer, real token, slot) routing choices the live router makes differently."""
    ids, attn = batch.sequences[:, :-1], batch.attention_mask[:, :-1]
    live = policy.model(ids, attention_mask=attn, return_routing=True).routing.sort(-1).values
    recorded = batch.routing.sort(-1).values
    real = attn.bool()
    return float((live != recorded).any(-1)[:, real].float().mean())


def run(keep_routing: bool, steps: int, lr: float, mini_batches: int, seed: int) -> list[dict]:
    torch.manual_seed(seed)
    policy = load_policy("tiny-native", device="cpu")
    cfg = GRPOConfig(
        steps=steps, prompts_per_step=len(PROMPTS), group_size=8, mini_batches=mini_batches,
        micro_batch=64, lr=lr, keep_routing=keep_routing, old_logprobs="sampling",
    )  # fmt: skip
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=lr, betas=(0.9, 0.99))
    tasks = [Task(id=f"p{i}", domain="toy", prompt=p) for i, p in enumerate(PROMPTS)]
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=12)
    rows = []
    for step in range(steps):
        policy.model.eval()
        g = torch.Generator().manual_seed(seed * 1000 + step)
        batch = rollout(policy, tasks, cfg.group_size, sampling, generator=g, keep_routing=True)
        policy.model.train()
        rewards = torch.tensor([letter_reward(t) for t in batch.completions])
        adv = group_advantages(rewards, cfg.group_size)
        updates = grpo_update(
            policy, optimizer, batch, adv, cfg, temperature=1.0, ref_logprobs=None,
            kl_coefs=torch.zeros(len(batch)), generator=torch.Generator().manual_seed(step),
        )  # fmt: skip
        later = updates[1:]
        rows.append(
            {
                "step": step + 1,
                "reward": float(rewards.mean()),
                "abs_log_ratio": sum(u["abs_log_ratio"] for u in later) / len(later),
                "clip_frac": sum(u["clip_frac"] for u in later) / len(later),
                "ratio_max": max(u["ratio_max"] for u in later),
                "ratio_min": min(u["ratio_min"] for u in later),
                "routing_flips": flip_fraction(policy, batch),
                "first_update_abs_log_ratio": updates[0]["abs_log_ratio"],
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--mini-batches", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="10 steps")
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args(argv)
    steps = 10 if args.quick else args.steps
    t = time.time()
    runs = {
        name: run(keep, steps, args.lr, args.mini_batches, args.seed)
        for name, keep in (("keep_routing", True), ("live_routing", False))
    }

    def mean(name, key):
        return sum(r[key] for r in runs[name]) / len(runs[name])

    summary = {
        "steps": steps,
        "lr": args.lr,
        "mini_batches": args.mini_batches,
        "seconds": round(time.time() - t, 1),
        **{
            f"{key}_{name}": mean(name, key)
            for name in runs
            for key in ("abs_log_ratio", "clip_frac", "routing_flips", "reward")
        },
    }
    summary["abs_log_ratio_live_over_keep"] = summary["abs_log_ratio_live_routing"] / max(
        summary["abs_log_ratio_keep_routing"], 1e-12
    )
    summary["clip_frac_live_over_keep"] = summary["clip_frac_live_routing"] / max(
        summary["clip_frac_keep_routing"], 1e-12
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rl_keep_routing.json").write_text(json.dumps({"summary": summary, "runs": runs}, indent=2) + "\n")
    _plot(runs, out / "rl_keep_routing.png")
    print(json.dumps(summary, indent=2))
    return 0


def _plot(runs: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for name, rows in runs.items():
        steps = [r["step"] for r in rows]
        axes[0].plot(steps, [r["abs_log_ratio"] for r in rows], label=name)
        axes[1].plot(steps, [r["routing_flips"] for r in rows], label=name)
        axes[2].plot(steps, [r["reward"] for r in rows], label=name)
    for ax, title in zip(axes, ["off-policy mean |log π_θ/π_old|", "routing flips vs rollout", "reward"]):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
