"""The report of a post-training run: held-out accuracy and well-formed tool use of the base model,
after cold-start SFT and after agentic GRPO, as ``report.json``, ``report.md`` and ``report.png``.

``report.json`` keys: ``accuracy_{base,sft,rl}``, ``tool_call_valid_{base,sft,rl}`` (shares of
held-out episodes, greedy), ``interval_{base,sft,rl}`` (the Wilson 95 % interval of each accuracy),
``heldout_tasks``, ``minutes`` (wall clock of the whole run), ``rl_gain`` (``accuracy_rl −
accuracy_sft``), ``intervals_overlap`` (whether the SFT and GRPO intervals overlap) and
``rl_vs_sft_paired`` (:func:`paired_change`: the tasks only one of the two solved), ``transfer``
(the environment the policy never trained on: its accuracy and well-formed tool use per stage; None
without ``[transfer]``), ``rl_curve`` (``train``: sampled reward, accuracy and well-formed tool use
per GRPO step; ``heldout``: greedy held-out accuracy with its interval at step 0 — the SFT model —,
every ``eval.every`` steps and after the last, each over the same ``tasks``: the first
``tasks.curve`` held-out tasks, or all), and ``details`` (per-stage summaries, timings, the
machine).
"""

from __future__ import annotations

import json
import math
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


def peak_memory_mb() -> float:
    """This process's peak resident memory (the kernels and sandboxes are other processes)."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1024 * 1024 if sys.platform == "darwin" else 1024), 1)


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95 % for ``z`` = 1.96): unlike the normal
    approximation it stays inside [0, 1] and is not empty at 0 or n successes."""
    if n <= 0:
        raise ValueError(f"an interval needs at least one trial, got n = {n}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, {n}], got {successes}")
    p, z2 = successes / n, z * z
    center = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return round(max(0.0, center - half), 4), round(min(1.0, center + half), 4)


def interval_of(summary: dict) -> tuple[float, float]:
    """The 95 % interval of an evaluation's accuracy (``episodes`` greedy episodes)."""
    n = summary["episodes"]
    return wilson(round(summary["accuracy"] * n), n)


#: What the curve keeps of each GRPO step's metrics record.
TRAIN_CURVE_KEYS = ("step", "reward_mean", "accuracy", "tool_call_valid", "kl", "first_update_abs_log_ratio")


def first_tasks(summary: dict, n: int) -> dict:
    """An evaluation counted over its first ``n`` tasks (its ``outcomes`` are in task order):
    ``episodes``, ``accuracy`` and ``tool_call_valid``; the whole summary when it has no more."""
    if n <= 0:
        raise ValueError(f"an evaluation over its first n tasks needs n >= 1, got {n}")
    outcomes = summary.get("outcomes") or []
    if n >= len(outcomes):
        return summary
    part = outcomes[:n]
    return {
        "episodes": n,
        "accuracy": sum(bool(o["correct"]) for o in part) / n,
        "tool_call_valid": sum(bool(o["tool_call_valid"]) for o in part) / n,
    }


def rl_curve(rl_metrics: list[dict], heldout_evals: list[dict]) -> dict[str, list[dict]]:
    """The learning curve: per GRPO step the sampled episodes' reward, accuracy and well-formed tool
    use, and the KL to the reference policy (mean per episode; 0 without a KL term); the held-out
    greedy accuracy (with its interval, over ``tasks`` tasks) at the steps it was measured."""
    train = [{k: r.get(k) for k in TRAIN_CURVE_KEYS} for r in rl_metrics if "reward_mean" in r]
    held = [
        {
            "step": e["step"],
            "accuracy": e["accuracy"],
            "tool_call_valid": e["tool_call_valid"],
            "interval": list(interval_of(e)),
            "tasks": e["episodes"],
        }
        for e in sorted(heldout_evals, key=lambda e: e["step"])
    ]
    return {"train": train, "heldout": held}


def curve_subset(report: dict[str, Any]) -> int | None:
    """How many held-out tasks (the first ones) the held-out curve counts, when not all of them."""
    points = (report.get("rl_curve") or {}).get("heldout") or []
    counted = {h.get("tasks", report["heldout_tasks"]) for h in points}
    return counted.pop() if len(counted) == 1 and report["heldout_tasks"] not in counted else None


def paired_change(before: dict, after: dict) -> dict[str, Any] | None:
    """Task by task (the evaluations' ``outcomes``, matched by task id): how many tasks only
    ``after`` solved, how many only ``before`` did, and the exact two-sided McNemar p-value of that
    split (a binomial sign test on the discordant tasks; 1.0 when there are none). None when either
    evaluation has no outcomes or they are not of the same tasks."""
    a = {o["id"]: o["correct"] for o in before.get("outcomes") or []}
    b = {o["id"]: o["correct"] for o in after.get("outcomes") or []}
    if not a or a.keys() != b.keys():
        return None
    gained = sum(b[k] and not a[k] for k in a)
    lost = sum(a[k] and not b[k] for k in a)
    n = gained + lost
    tail = sum(math.comb(n, k) for k in range(min(gained, lost) + 1)) / 2**n if n else 0.5
    return {
        "solved_only_after": gained,
        "solved_only_before": lost,
        "mcnemar_p": float(f"{min(1.0, 2 * tail):.4g}"),  # significant digits: a small p stays > 0
    }


def report_dict(
    evals: dict[str, dict],
    heldout: int,
    minutes: float,
    details: dict[str, Any],
    *,
    transfer: dict[str, Any] | None = None,
    curve: dict[str, list[dict]] | None = None,
) -> dict[str, Any]:
    missing = [s for s in STAGES if s not in evals]
    if missing:
        raise ValueError(f"the report needs the evaluations of every stage; missing {missing}")
    out: dict[str, Any] = {}
    for stage in STAGES:
        out[f"accuracy_{stage}"] = evals[stage]["accuracy"]
        out[f"tool_call_valid_{stage}"] = evals[stage]["tool_call_valid"]
        out[f"interval_{stage}"] = list(interval_of(evals[stage]))
    (_, sft_hi), (rl_lo, rl_hi) = out["interval_sft"], out["interval_rl"]
    out |= {
        "heldout_tasks": heldout,
        "minutes": round(minutes, 2),
        "rl_gain": round(out["accuracy_rl"] - out["accuracy_sft"], 4),
        "intervals_overlap": not (rl_lo > sft_hi or rl_hi < out["interval_sft"][0]),
        "rl_vs_sft_paired": paired_change(evals["sft"], evals["rl"]),
        "transfer": transfer,
        "rl_curve": curve or {"train": [], "heldout": []},
        "details": details,
    }
    return out


STAGE_NAMES = ("base (V3.2 tokens added, untrained)", "after cold-start SFT", "after agentic GRPO")


def _interval(report: dict[str, Any], stage: str) -> str:
    lo, hi = report.get(f"interval_{stage}") or (None, None)
    return "–" if lo is None else f"[{lo:.3f}, {hi:.3f}]"


def report_markdown(report: dict[str, Any]) -> str:
    d = report["details"]
    rows = "\n".join(
        f"| {name} | {report[f'accuracy_{s}']:.3f} | {_interval(report, s)} | "
        f"{report[f'tool_call_valid_{s}']:.3f} | {d['evals'][s]['used_tool']:.3f} | "
        f"{d['evals'][s]['mean_steps']:.2f} |"
        for s, name in zip(STAGES, STAGE_NAMES)
    )
    m = d["machine"]
    text = (
        "# Post-training proof run\n\n"
        f"{d['model']} on {d['task']}; {report['heldout_tasks']} held-out tasks, greedy, "
        f"{report['minutes']:.1f} minutes end to end ({m['cpus']} CPUs, {m['torch_threads']} torch threads; "
        f"load average at the start {d['load_start']}, at the end {m['load_average_1_5_15']}).\n\n"
        "| model | accuracy | 95 % interval (Wilson) | well-formed tool calls | used the tool | "
        "model calls / episode |\n"
        "|---|---|---|---|---|---|\n"
        f"{rows}\n\n"
    )
    if "rl_gain" in report:
        overlap = "overlap" if report["intervals_overlap"] else "do not overlap"
        text += f"GRPO over SFT: {report['rl_gain']:+.3f} absolute; the two intervals {overlap}"
        paired = report.get("rl_vs_sft_paired")
        if paired:
            text += (
                f"; task by task, GRPO solved {paired['solved_only_after']} held-out tasks SFT had not "
                f"and lost {paired['solved_only_before']} SFT had solved (exact McNemar p = "
                f"{paired['mcnemar_p']:.3g})"
            )
        text += ".\n\n"
    t = report.get("transfer")
    if t:
        text += (
            f"Transfer (never trained on): {t['env']}, {t['tasks']} tasks, greedy — accuracy "
            + ", ".join(f"{s} {t[f'accuracy_{s}']:.3f}" for s in STAGES)
            + "; well-formed tool use "
            + ", ".join(f"{s} {t[f'tool_call_valid_{s}']:.3f}" for s in STAGES)
            + ".\n\n"
        )
    curve = report.get("rl_curve") or {}
    if curve.get("heldout"):
        subset = curve_subset(report)
        text += (
            "Held-out accuracy during GRPO"
            + (f" (the first {subset} held-out tasks)" if subset else "")
            + ": "
            + ", ".join(f"step {h['step']}: {h['accuracy']:.3f}" for h in curve["heldout"])
            + ".\n\n"
        )
    if curve.get("train"):
        text += (
            "Sampled training reward per GRPO step: "
            + ", ".join(f"{r['reward_mean']:.2f}" for r in curve["train"])
            + ".\n\n"
        )
    pool = (d.get("tasks") or {}).get("rl_pool")
    if pool and pool["rule"] == "unsolved":
        text += (
            f"GRPO's task pool: the {pool['pool']} of {pool['train']} training tasks the SFT model does "
            f"not solve greedily (it solves {pool['solved_by_sft']})"
            + (
                f", and {pool['solved_share']:.0%} of each step's tasks from the solved ones"
                if pool.get("solved_share")
                else ""
            )
            + ".\n\n"
        )
    g = d.get("grpo")
    if g:
        kl = "no KL term"
        if g["kl_coef"]:
            per_step = ", ".join(f"{r.get('kl') or 0.0:.1e}" for r in curve.get("train") or [])
            kl = f"KL toward the SFT model β = {g['kl_coef']:g} (mean KL per step: {per_step})"
        text += (
            f"GRPO: {g['steps']} steps of {g['prompts_per_step']} tasks × {g['group_size']} episodes, "
            f"lr {g['lr']:g}, {kl}.\n\n"
        )
    text += (
        f"Stage minutes: {json.dumps(d['stage_minutes'])}. Cold start: {d['cold_start']['kept']} verified "
        f"conversations kept of {d['cold_start']['tasks']} tasks. Command: `{d['command']}`.\n"
    )
    return text


def plot_report(report: dict[str, Any], sft_metrics: list[dict], rl_metrics: list[dict], png: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    transfer = report.get("transfer")
    fig, axes = plt.subplots(1, 4 if transfer else 3, figsize=(18 if transfer else 14, 3.8))
    acc = [report[f"accuracy_{s}"] for s in STAGES]
    intervals = (
        [report[f"interval_{s}"] for s in STAGES] if all(f"interval_{s}" in report for s in STAGES) else None
    )
    _stage_bars(
        axes[0], acc, [report[f"tool_call_valid_{s}"] for s in STAGES],
        f"held-out ({report['heldout_tasks']} tasks, greedy)", intervals,
    )  # fmt: skip
    ax = axes[1]
    ax.plot(
        [r["step"] for r in sft_metrics], [r["loss"] for r in sft_metrics], color="tab:blue", label="train"
    )
    held = [r for r in sft_metrics if r.get("eval_loss") is not None]
    if held:
        ax.plot(
            [r["step"] for r in held],
            [r["eval_loss"] for r in held],
            "o-",
            color="tab:red",
            label="validation",
        )
        ax.legend(fontsize=8)
    ax.set_xlabel("SFT step")
    ax.set_ylabel("loss on assistant tokens")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax = axes[2]
    steps = [r["step"] for r in rl_metrics]
    ax.plot(steps, [r["reward_mean"] for r in rl_metrics], label="sampled reward", color="tab:green")
    ax.plot(steps, [r.get("accuracy", 0) for r in rl_metrics], label="sampled accuracy", color="tab:olive")
    ax.plot(
        steps, [r.get("tool_call_valid", 0) for r in rl_metrics], label="sampled tool use", color="tab:orange"
    )
    points = (report.get("rl_curve") or {}).get("heldout") or []
    if points:
        ys = [h["accuracy"] for h in points]
        subset = curve_subset(report)
        ax.errorbar(
            [h["step"] for h in points],
            ys,
            yerr=_yerr(ys, [h["interval"] for h in points]),
            fmt="s-",
            color="tab:purple",
            capsize=3,
            label=f"held-out accuracy (greedy{f', first {subset} tasks' if subset else ''})",
        )
    ax.set_xlabel("GRPO step")
    ax.set_ylim(0, max(1.05, *(r["reward_mean"] + 0.05 for r in rl_metrics)) if rl_metrics else 1.05)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    if transfer:
        _stage_bars(
            axes[3], [transfer[f"accuracy_{s}"] for s in STAGES], [transfer[f"tool_call_valid_{s}"] for s in STAGES],
            f"transfer: {transfer['env']} ({transfer['tasks']} tasks, never trained on)",
        )  # fmt: skip
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


def _yerr(values: list[float], intervals: list) -> list[list[float]]:
    """Matplotlib's ``yerr`` (distances below and above) of ``values`` with ``(low, high)`` intervals."""
    return [
        [v - lo for v, (lo, _) in zip(values, intervals)],
        [hi - v for v, (_, hi) in zip(values, intervals)],
    ]


def _stage_bars(ax, accuracy: list[float], valid: list[float], title: str, intervals=None) -> None:
    """Accuracy (with its intervals, when given) and well-formed tool calls per stage, side by side."""
    x = range(len(STAGES))
    err = None if intervals is None else _yerr(accuracy, intervals)
    label = "accuracy" if intervals is None else "accuracy (95 % interval)"
    ax.bar([i - 0.2 for i in x], accuracy, 0.4, yerr=err, capsize=4, label=label)
    ax.bar([i + 0.2 for i in x], valid, 0.4, label="well-formed tool calls")
    ax.set_xticks(list(x), ["base", "cold-start SFT", "agentic GRPO"])
    ax.set_ylim(0, 1.05)
    ax.set_title(title)
    ax.legend(fontsize=8)
