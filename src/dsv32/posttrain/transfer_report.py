"""The report of the transfer run (``dsv32 posttrain proof configs/posttrain-transfer-smollm2.toml``):
every stage — base, cold-start SFT, GRPO on synthesized environments (``rl``), GRPO on the code
interpreter alone (``rl_code``) — on every suite, as ``report.json``, ``report.md`` and ``report.png``.

``report.json`` top-level keys (fractions in [0, 1]): ``envs_synthesized``, ``synth_heldout_tasks``,
``synth_heldout_{base,sft,rl,rl_code}`` (accuracy on held-out synthesized environments: domains,
tables and tools never trained on), ``synth_heldout_intervals_apart`` (whether the Wilson 95 %
intervals of SFT and ``rl`` there are disjoint), ``general_{base,sft,rl,rl_code}`` and
``general_tasks`` (the hand-written general-tools categories), ``bfcl_entries`` and
``bfcl_{base,sft,rl,rl_code}`` (BFCL single-turn through its own AST checker), ``bfcl_mcnemar_p``
(``rl`` against SFT, task by task, exact), ``code_heldout_*`` (the code interpreter: the code-only
arm's own domain) when evaluated, ``minutes``; then ``suites`` (per suite and stage: accuracy, its
interval, well-formed tool use, episodes, and the paired comparison with SFT — tasks gained, lost,
exact McNemar p), ``rl_curves`` (per arm, the sampled reward, accuracy and well-formed tool use of
every GRPO step) and ``details``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dsv32.posttrain.report import _yerr, interval_of, paired_change

STAGES = ("base", "sft", "rl", "rl_code")
STAGE_NAMES = {
    "base": "base (V3.2 tokens added, untrained)",
    "sft": "cold-start SFT",
    "rl": "GRPO on synthesized environments",
    "rl_code": "GRPO on the code interpreter only",
}
#: The suites, in the report's order, with what each measures.
SUITES = {
    "synth_heldout": "held-out synthesized environments (unseen domains and toolsets)",
    "general": "general-tools: trip, inventory, calendar (never trained on)",
    "bfcl": "BFCL single-turn (BFCL's AST checker)",
    "code_heldout": "code interpreter, held-out (the code-only arm's own domain)",
}
ARMS = ("rl", "rl_code")


def suite_report(evals: dict[str, dict]) -> dict[str, Any]:
    """One suite's stages: accuracy, Wilson 95 % interval, well-formed tool use, episodes, and (every
    stage but SFT) the paired comparison with SFT."""
    missing = [s for s in STAGES if s not in evals]
    if missing:
        raise ValueError(f"the report needs every stage's evaluation; missing {missing}")
    out: dict[str, Any] = {}
    for stage in STAGES:
        e = evals[stage]
        out[stage] = {
            "accuracy": e["accuracy"],
            "interval": list(interval_of(e)),
            "tool_call_valid": e["tool_call_valid"],
            "episodes": e["episodes"],
            "vs_sft": None if stage == "sft" else paired_change(evals["sft"], e),
        }
    return out


def apart(a: list[float], b: list[float]) -> bool:
    """Whether two intervals are disjoint."""
    return a[1] < b[0] or b[1] < a[0]


def transfer_report_dict(
    evals: dict[str, dict[str, dict]],
    envs_synthesized: int,
    minutes: float,
    details: dict[str, Any],
    curves: dict[str, dict] | None = None,
) -> dict[str, Any]:
    """``evals[suite][stage]``: evaluation summaries (``episodes``, ``accuracy``,
    ``tool_call_valid``, ``outcomes``); the suites ``synth_heldout``, ``general`` and ``bfcl`` are
    required, ``code_heldout`` optional."""
    missing = [s for s in ("synth_heldout", "general", "bfcl") if s not in evals]
    if missing:
        raise ValueError(f"the report needs the suites {missing}")
    suites = {name: suite_report(evals[name]) for name in SUITES if name in evals}
    synth = suites["synth_heldout"]
    paired = synth["rl"]["vs_sft"]
    bfcl_paired = suites["bfcl"]["rl"]["vs_sft"]
    out: dict[str, Any] = {
        "envs_synthesized": envs_synthesized,
        "synth_heldout_tasks": synth["sft"]["episodes"],
    }
    for name, suite in suites.items():
        out |= {f"{name}_{stage}": suite[stage]["accuracy"] for stage in STAGES}
    out |= {
        "synth_heldout_intervals_apart": apart(synth["sft"]["interval"], synth["rl"]["interval"]),
        "synth_heldout_mcnemar_p": paired["mcnemar_p"] if paired else 1.0,
        "general_tasks": suites["general"]["sft"]["episodes"],
        "bfcl_entries": suites["bfcl"]["sft"]["episodes"],
        "bfcl_mcnemar_p": bfcl_paired["mcnemar_p"] if bfcl_paired else 1.0,
        "minutes": round(minutes, 2),
        "suites": suites,
        "rl_curves": curves or {arm: {"train": [], "heldout": []} for arm in ARMS},
        "details": details,
    }
    return out


def _row(stage: str, s: dict[str, Any]) -> str:
    lo, hi = s["interval"]
    paired = s["vs_sft"]
    vs = (
        f"+{paired['solved_only_after']} / −{paired['solved_only_before']} | {paired['mcnemar_p']:.3g}"
        if paired
        else "– | –"
    )
    return f"| {STAGE_NAMES[stage]} | {s['accuracy']:.3f} | [{lo:.3f}, {hi:.3f}] | {s['tool_call_valid']:.3f} | {vs} |"


def transfer_markdown(report: dict[str, Any]) -> str:
    d = report["details"]
    m = d["machine"]
    text = (
        "# Transfer of agentic RL (paper §4.3)\n\n"
        f"{d['model']}; {report['envs_synthesized']} synthesized environments (training domains "
        f"{', '.join(d['split']['train'])}; held out {', '.join(d['split']['heldout'])}). "
        f"{report['minutes']:.1f} minutes end to end ({m['cpus']} CPUs, {m['torch_threads']} torch threads; "
        f"load average at the start {d['load_start']}, at the end {m['load_average_1_5_15']}).\n\n"
    )
    for name, suite in report["suites"].items():
        n = suite["sft"]["episodes"]
        text += (
            f"## {SUITES[name]} — {n} {'entries' if name == 'bfcl' else 'tasks'}, greedy\n\n"
            "| model | accuracy | 95 % interval (Wilson) | well-formed tool use | vs SFT: gained / lost | "
            "exact McNemar p |\n|---|---|---|---|---|---|\n"
            + "\n".join(_row(stage, suite[stage]) for stage in STAGES)
            + "\n\n"
        )
    apart_ = "do not overlap" if report["synth_heldout_intervals_apart"] else "overlap"
    text += (
        f"On held-out synthesized environments the SFT and GRPO-on-synthesized intervals {apart_}; "
        f"on BFCL, GRPO on synthesized environments against SFT: exact McNemar p = "
        f"{report['bfcl_mcnemar_p']:.3g}.\n\n"
    )
    for arm in ARMS:
        train = report["rl_curves"][arm]["train"]
        if train:
            text += (
                f"Sampled reward per GRPO step ({STAGE_NAMES[arm]}): "
                + ", ".join(f"{r['reward_mean']:.2f}" for r in train)
                + ".\n\n"
            )
    g = d.get("grpo")
    if g:
        text += (
            f"GRPO, both arms: {g['steps']} steps of {g['prompts_per_step']} tasks × {g['group_size']} "
            f"episodes, lr {g['lr']:g}, KL β = {g['kl_coef']:g}.\n\n"
        )
    cold = d["cold_start"]
    text += (
        f"Cold start: {cold['synth']['kept']} verified synthesized-environment transcripts and "
        f"{cold['code']['kept'] if cold.get('code') else 0} code-interpreter transcripts. "
        f"Stage minutes: {json.dumps(d['stage_minutes'])}. Command: `{d['command']}`.\n"
    )
    return text


def plot_transfer(report: dict[str, Any], png: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    suites = report["suites"]
    fig, axes = plt.subplots(1, len(suites) + 1, figsize=(4.6 * (len(suites) + 1), 3.9))
    x = range(len(STAGES))
    for ax, (name, suite) in zip(axes, suites.items()):
        acc = [suite[s]["accuracy"] for s in STAGES]
        ax.bar([i - 0.2 for i in x], acc, 0.4, yerr=_yerr(acc, [suite[s]["interval"] for s in STAGES]),
               capsize=4, label="accuracy (95 % interval)")  # fmt: skip
        ax.bar(
            [i + 0.2 for i in x],
            [suite[s]["tool_call_valid"] for s in STAGES],
            0.4,
            label="well-formed tool use",
        )
        ax.set_xticks(list(x), ["base", "SFT", "GRPO synth", "GRPO code"])
        ax.set_ylim(0, 1.05)
        ax.set_title(f"{name} ({suite['sft']['episodes']})", fontsize=9)
        ax.legend(fontsize=7)
    ax = axes[-1]
    for arm, color in zip(ARMS, ("tab:green", "tab:red")):
        train = report["rl_curves"][arm]["train"]
        ax.plot([r["step"] for r in train], [r["reward_mean"] for r in train], "o-", color=color,
                label=f"sampled reward: {STAGE_NAMES[arm]}")  # fmt: skip
    ax.set_xlabel("GRPO step")
    rewards = [r["reward_mean"] for arm in ARMS for r in report["rl_curves"][arm]["train"]]
    ax.set_ylim(0, max([1.05, *(r + 0.05 for r in rewards)]))  # the format term can lift it above 1
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def write_transfer_report(out: Path, report: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(transfer_markdown(report))
    plot_transfer(report, out / "report.png")
    return out / "report.json"
