"""Loss curves of a training stage (``metrics.jsonl`` → PNG), drawn with matplotlib's Agg backend."""

from __future__ import annotations

from pathlib import Path

from dsv32.runlog import read_metrics


def plot_metrics(metrics_path: str | Path, png_path: str | Path, title: str = "") -> Path | None:
    """Plot ``loss_indexer`` (and ``loss_lm`` when present) against the step; None if no metrics."""
    rows = read_metrics(metrics_path)
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    has_lm = any("loss_lm" in r for r in rows)
    fig, axes = plt.subplots(1, 2 if has_lm else 1, figsize=(10 if has_lm else 5.5, 3.6), squeeze=False)
    ax = axes[0][0]
    ax.plot(steps, [r["loss_indexer"] for r in rows], color="tab:blue")
    ax.set_xlabel("step")
    ax.set_ylabel("indexer KL loss (mean over layers)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    if has_lm:
        ax = axes[0][1]
        ax.plot(steps, [r.get("loss_lm") for r in rows], color="tab:orange")
        ax.set_xlabel("step")
        ax.set_ylabel("LM loss (nats/token)")
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    png_path = Path(png_path)
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return png_path
