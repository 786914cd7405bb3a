"""Keep Routing's effect on the training/inference ratio (paper §3.1), on a tiny random MoE.

Two GRPO runs from the same initialization, seeds and data — one replaying the experts recorded at
sampling time in the training forward (Keep Routing), one letting the live router choose. Each rollout
batch is split into several mini-batches, so later updates run off-policy and the router drifts.

After each step's updates (θ is then off-policy for the batch it trained on) we measure, at the same
θ and on the same tokens, the training-side log-probs twice — with the recorded routing and with the
live router's — against the sampling log-probs: mean |log π_θ/π_old| and the share of tokens whose
ratio leaves the clip range [1 − ε, 1 + ε]. The difference between the two is what Keep Routing
removes from the importance ratio: the part caused by routing flips (also reported: the share of
(MoE layer, token) decisions the live router now makes differently from the rollout).

    python benchmarks/rl_keep_routing.py [--steps 30] [--lr 3e-4] [--expert-scale 4] [--quick]

The tiny MoE's experts are scaled up from their fresh initialization (``--expert-scale``): at the
default init they are near-interchangeable ~0 functions, and a flip changes nothing measurable
(measured: live/recorded |log ratio| 1.00–1.05 at scale 1); trained experts are distinct functions.

Writes ``runs/bench/rl_keep_routing.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from dsv32.engine.models import ByteTokenizer, tiny_native_config
from dsv32.rl.grpo.config import GRPOConfig
from dsv32.rl.grpo.loss import group_advantages
from dsv32.rl.grpo.policy import Policy
from dsv32.rl.grpo.rollout import SamplingConfig, rollout
from dsv32.rl.grpo.tasks import Task
from dsv32.rl.grpo.update import grpo_update

PROMPTS = ["ab", "xyz", "hello", "q", "rl", "moe", "keep", "route"]


def letter_reward(text: str) -> float:
    """Share of the first 8 characters that are lowercase ASCII letters."""
    return sum("a" <= ch <= "z" for ch in text[:8]) / 8


@torch.no_grad()
def paired_ratio(policy, batch, clip_eps: float = 0.2) -> dict:
    """At the current θ: routing flips, and |log π_θ/π_old| / out-of-clip share with the recorded and
    with the live routing (same tokens, same parameters)."""
    ids, attn = batch.sequences[:, :-1], batch.attention_mask[:, :-1]
    live = policy.model(ids, attention_mask=attn, return_routing=True).routing.sort(-1).values
    real = attn.bool()
    flips = float((live != batch.routing.sort(-1).values).any(-1)[:, real].float().mean())
    mask = batch.action_mask
    out = {"routing_flips": flips}
    rows = batch.rows(torch.arange(len(batch)))
    for name, routing in (("kept", batch.routing), ("live", None)):
        logp = policy.action_logprobs(**(rows | {"routing": routing}))
        log_r = (logp - batch.sampling_logprobs)[mask]
        out[f"abs_log_ratio_{name}"] = float(log_r.abs().mean())
        out[f"out_of_clip_{name}"] = float(((log_r.exp() - 1).abs() > clip_eps).float().mean())
    return out


def tiny_moe_policy(seed: int, expert_scale: float = 4.0) -> Policy:
    """A tiny MoE where routing matters: every layer MoE, 8 experts, top-1 (a flip swaps the whole
    expert output), no group limit — unlike ``tiny-native``, whose 2-of-4 group-limited experts barely
    move its logits."""
    from dsv32.model import DeepseekV32

    torch.manual_seed(seed)
    cfg = tiny_native_config(
        num_hidden_layers=3, first_k_dense_replace=0, n_routed_experts=8, num_experts_per_tok=1,
        n_group=1, topk_group=1, moe_intermediate_size=64, n_shared_experts=0, routed_scaling_factor=2.5,
        eos_token_id=ByteTokenizer.eos_token_id, pad_token_id=ByteTokenizer.pad_token_id,
    )  # fmt: skip
    model = DeepseekV32(cfg)
    with torch.no_grad():  # trained experts are distinct functions of real size, not ~0 like a fresh init
        for name, p in model.named_parameters():
            if ".experts." in name:
                p.mul_(expert_scale)
    return Policy(model, ByteTokenizer(), "native")


def run(
    keep_routing: bool, steps: int, lr: float, mini_batches: int, seed: int, expert_scale: float
) -> list[dict]:
    policy = tiny_moe_policy(seed, expert_scale)
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
            policy, optimizer, batch, adv, cfg, temperature=1.0, ref=None,
            generator=torch.Generator().manual_seed(step),
        )  # fmt: skip
        rows.append(
            {"step": step + 1, "reward": float(rewards.mean()), "clip_frac": _mean(updates, "clip_frac")}
            | paired_ratio(policy, batch)
        )
    return rows


def _mean(updates: list[dict], key: str) -> float:
    return sum(u[key] for u in updates) / len(updates)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--expert-scale", type=float, default=4.0, help="multiply the fresh experts' weights")
    ap.add_argument("--mini-batches", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="10 steps")
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args(argv)
    steps = 10 if args.quick else args.steps
    t = time.time()
    runs = {
        name: run(keep, steps, args.lr, args.mini_batches, args.seed, args.expert_scale)
        for name, keep in (("keep_routing", True), ("live_routing", False))
    }

    def mean(name, key):
        return sum(r[key] for r in runs[name]) / len(runs[name])

    keys = ("abs_log_ratio_kept", "abs_log_ratio_live", "out_of_clip_kept", "out_of_clip_live")
    summary = {
        "steps": steps,
        "lr": args.lr,
        "mini_batches": args.mini_batches,
        "expert_scale": args.expert_scale,
        "seconds": round(time.time() - t, 1),
        **{
            f"{name}.{key}": mean(name, key)
            for name in runs
            for key in (*keys, "routing_flips", "clip_frac", "reward")
        },
    }
    for name in runs:  # how much larger the off-policy ratio is when the router may flip
        summary[f"{name}.abs_log_ratio_live_over_kept"] = mean(name, "abs_log_ratio_live") / max(
            mean(name, "abs_log_ratio_kept"), 1e-12
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
        axes[0].plot(steps, [r["abs_log_ratio_kept"] for r in rows], label=f"{name}: recorded routing")
        axes[0].plot(steps, [r["abs_log_ratio_live"] for r in rows], ls="--", label=f"{name}: live routing")
        axes[1].plot(steps, [r["routing_flips"] for r in rows], label=name)
        axes[2].plot(steps, [r["reward"] for r in rows], label=name)
    titles = ["mean |log π_θ/π_old| after the step's updates", "routing flips vs rollout", "reward"]
    for ax, title in zip(axes, titles):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
