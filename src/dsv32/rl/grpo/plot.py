"""RL curves (``metrics.jsonl`` + ``eval.jsonl`` → PNG): reward and held-out accuracy, KL and ratio
statistics, clip / masked fractions, completion lengths."""

from __future__ import annotations

import math
from pathlib import Path

from dsv32.runlog import read_metrics


def plot_rl_metrics(metrics_path: str | Path, eval_path: str | Path, png_path: str | Path) -> Path | None:
    rows = read_metrics(metrics_path)
    if not rows:
        return None
    evals = read_metrics(eval_path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]

    def series(key):
        return [r.get(key, math.nan) if r.get(key) is not None else math.nan for r in rows]

    fig, axes = plt.subplots(2, 2, figsize=(11, 6.5))
    ax = axes[0][0]
    ax.plot(steps, series("reward_mean"), label="train reward (mean)", color="tab:blue")
    ax.plot(steps, series("accuracy"), label="train accuracy", color="tab:cyan", alpha=0.7)
    if evals:
        ax.plot(
            [e["step"] for e in evals],
            [e["accuracy"] for e in evals],
            "o-",
            color="tab:red",
            label="held-out accuracy",
        )
    ax.set_xlabel("step")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax = axes[0][1]
    ax.plot(steps, series("ratio_mean"), label="ratio mean", color="tab:green")
    ax.plot(steps, series("ratio_max"), label="ratio max", color="tab:olive", alpha=0.6)
    ax.plot(steps, series("ratio_min"), label="ratio min", color="tab:olive", alpha=0.6, ls="--")
    ax.set_xlabel("step")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax = axes[1][0]
    ax.plot(steps, series("clip_frac"), label="clip fraction", color="tab:purple")
    ax.plot(steps, series("opsm_masked_frac"), label="OPSM masked fraction", color="tab:brown")
    ax.plot(steps, series("kl"), label="KL estimate", color="tab:gray")
    ax.set_xlabel("step")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax = axes[1][1]
    ax.plot(steps, series("length_mean"), label="completion tokens (mean)", color="tab:orange")
    ax.set_xlabel("step")
    ax.set_ylabel("tokens")
    ax.grid(alpha=0.3)
    twin = ax.twinx()
    twin.plot(steps, series("truncated_frac"), label="truncated fraction", color="tab:red", alpha=0.6)
    twin.set_ylim(0, 1)
    twin.set_ylabel("truncated fraction")
    lines = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(lines, [str(line.get_label()) for line in lines], fontsize=8)
    fig.suptitle("GRPO")
    fig.tight_layout()
    png_path = Path(png_path)
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return png_path
