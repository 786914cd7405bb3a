"""The report of a post-training run: held-out accuracy and well-formed tool use of the base model,
after cold-start SFT and after agentic GRPO, as ``report.json``, ``report.md`` and ``report.png``.

``report.json`` keys: ``accuracy_{base,sft,rl}``, ``tool_call_valid_{base,sft,rl}`` (shares of
held-out episodes, greedy), ``heldout_tasks``, ``minutes`` (wall clock of the whole run), and
``details`` (per-stage summaries, timings, the machine).
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

STAGES = ("base", "sft", "rl")


def machine() -> dict[str, Any]:
    """What the numbers were measured on (and how busy it was)."""
    import torch

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_1_5_15": [round(x, 2) for x in load] if load else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def report_dict(
    evals: dict[str, dict], heldout: int, minutes: float, details: dict[str, Any]
) -> dict[str, Any]:
    missing = [s for s in STAGES if s not in evals]
    if missing:
        raise ValueError(f"the report needs the evaluations of every stage; missing {missing}")
    out: dict[str, Any] = {}
    for stage in STAGES:
        out[f"accuracy_{stage}"] = evals[stage]["accuracy"]
        out[f"tool_call_valid_{stage}"] = evals[stage]["tool_call_valid"]
    out |= {"heldout_tasks": heldout, "minutes": round(minutes, 2), "details": details}
    return out


def report_markdown(report: dict[str, Any]) -> str:
    d = report["details"]
    rows = "\n".join(
        f"| {name} | {report[f'accuracy_{s}']:.3f} | {report[f'tool_call_valid_{s}']:.3f} | "
        f"{d['evals'][s]['used_tool']:.3f} | {d['evals'][s]['mean_steps']:.2f} |"
        for s, name in zip(
            STAGES, ("base (V3.2 tokens added, untrained)", "after cold-start SFT", "after agentic GRPO")
        )
    )
    m = d["machine"]
    return (
        "# Post-training proof run\n\n"
        f"{d['model']} on {d['task']}; {report['heldout_tasks']} held-out tasks, greedy, "
        f"{report['minutes']:.1f} minutes end to end ({m['cpus']} CPUs, {m['torch_threads']} torch threads; "
        f"load average at the start {d['load_start']}, at the end {m['load_average_1_5_15']}).\n\n"
        "| model | accuracy | well-formed tool calls | used the tool | model calls / episode |\n"
        "|---|---|---|---|---|\n"
        f"{rows}\n\n"
        f"Stage minutes: {json.dumps(d['stage_minutes'])}. Cold start: {d['cold_start']['kept']} verified "
        f"conversations kept of {d['cold_start']['tasks']} tasks. Command: `{d['command']}`.\n"
    )


def plot_report(report: dict[str, Any], sft_metrics: list[dict], rl_metrics: list[dict], png: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    ax = axes[0]
    x = range(len(STAGES))
    ax.bar([i - 0.2 for i in x], [report[f"accuracy_{s}"] for s in STAGES], 0.4, label="accuracy")
    ax.bar(
        [i + 0.2 for i in x],
        [report[f"tool_call_valid_{s}"] for s in STAGES],
        0.4,
        label="well-formed tool calls",
    )
    ax.set_xticks(list(x), ["base", "cold-start SFT", "agentic GRPO"])
    ax.set_ylim(0, 1.05)
    ax.set_title(f"held-out ({report['heldout_tasks']} tasks, greedy)")
    ax.legend(fontsize=8)
    ax = axes[1]
    ax.plot([r["step"] for r in sft_metrics], [r["loss"] for r in sft_metrics], color="tab:blue")
    ax.set_xlabel("SFT step")
    ax.set_ylabel("loss on assistant tokens")
    ax.grid(alpha=0.3)
    ax = axes[2]
    ax.plot(
        [r["step"] for r in rl_metrics],
        [r["reward_mean"] for r in rl_metrics],
        label="reward",
        color="tab:green",
    )
    ax.plot(
        [r["step"] for r in rl_metrics],
        [r.get("tool_call_valid", 0) for r in rl_metrics],
        label="tool use",
        color="tab:orange",
    )
    ax.set_xlabel("GRPO step")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def write_report(out: Path, report: dict[str, Any], sft_metrics: list[dict], rl_metrics: list[dict]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(report_markdown(report))
    plot_report(report, sft_metrics, rl_metrics, out / "report.png")
    return out / "report.json"
