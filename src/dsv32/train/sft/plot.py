"""The SFT loss curve (``metrics.jsonl`` → PNG, matplotlib's Agg backend)."""

from __future__ import annotations

from pathlib import Path

from dsv32.runlog import read_metrics


def plot_sft(metrics_path: str | Path, png_path: str | Path) -> Path | None:
    """Training loss (and the held-out loss where measured) per step; None when nothing was logged."""
    rows = read_metrics(metrics_path)
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], label="train", color="tab:blue")
    held = [r for r in rows if "eval_loss" in r]
    if held:
        ax.plot(
            [r["step"] for r in held],
            [r["eval_loss"] for r in held],
            "o-",
            label="held-out",
            color="tab:orange",
        )
    ax.set_xlabel("step")
    ax.set_ylabel("loss on assistant tokens (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    png_path = Path(png_path)
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return png_path
