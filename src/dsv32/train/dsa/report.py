"""The DSA report: ``dsa_report.json`` (numbers), ``dsa_report.md`` (tables) and ``dsa_recall.png``
(per-layer recall of the evaluated and untrained indexers beside the oracle)."""

from __future__ import annotations

import json
from pathlib import Path

from dsv32.train.dsa.evaluate import EvalPoint

#: How the tables name the evaluated indexer when the caller does not say which it is.
INDEXER = "the model's indexer"


def _fmt(x, digits: int = 4) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:+.2f}%"


def report_dict(points: list[EvalPoint], *, indexer: str = INDEXER, **extra) -> dict:
    """The JSON report: the headline fields of the first point (first length, first top-k), the whole
    grid, its per-layer breakdown, and ``extra`` (stages, timings, after-sparse results...).
    ``indexer`` names the evaluated indexer in the tables and the plot (``"indexer after the
    warm-up"``, ...)."""
    if not points:
        raise ValueError("no evaluation points to report")
    head = points[0]
    out = {
        "indexer": indexer,
        "seq_len": head.seq_len,
        "topk": head.topk,
        "attention_recall": head.attention_recall,
        "attention_recall_oracle": head.attention_recall_oracle,
        "attention_recall_untrained": head.attention_recall_untrained,
        "ppl_dense": head.ppl_dense,
        "ppl_dsa": head.ppl_dsa,
        "ppl_dsa_untrained": head.ppl_dsa_untrained,
        "ppl_dsa_oracle": head.ppl_dsa_oracle,
        "ppl_gap": head.ppl_gap,
        "eval_sequences": head.sequences,
        "eval_tokens": head.tokens,
        "per_layer": head.per_layer,
        "grid": [{k: v for k, v in p.to_dict().items() if k != "per_layer"} for p in points],
    }
    out.update(extra)
    return out


def plot_recall(points: list[EvalPoint], png: str | Path, label: str = INDEXER) -> Path | None:
    head = points[0]
    if not head.per_layer:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = [r["layer"] for r in head.per_layer]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.plot(layers, [r["oracle"] for r in head.per_layer], "k--", label="oracle top-k")
    ax.plot(layers, [r["recall"] for r in head.per_layer], "o-", color="tab:blue", label=label)
    if all(r["untrained"] is not None for r in head.per_layer):
        ax.plot(
            layers, [r["untrained"] for r in head.per_layer], "x:", color="tab:red", label="untrained indexer"
        )
    ax.set_xlabel("layer")
    ax.set_ylabel("attention recall")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"Attention recall at L={head.seq_len}, top-{head.topk}")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    png = Path(png)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def plot_final(domains: dict, png: str | Path) -> Path | None:
    """After the sparse stage: the recall per layer at every point beside the oracle's (left) and the
    gap by query position (right), for each text of a demo-shaped report's ``domains``."""
    series = [(domain, p) for domain, d in domains.items() for p in d.get("after_sparse", [])]
    if not any(p.get("per_layer") or p.get("by_position") for _, p in series):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (domain, p) in enumerate(series):
        label = f"{'in-domain' if domain == 'in_domain' else 'off-domain'} {p['seq_len']}/top-{p['topk']}"
        color = colors[i % len(colors)]
        rows = p.get("per_layer") or []
        if rows:
            layers = [r["layer"] for r in rows]
            left.plot(layers, [r["recall"] for r in rows], "o-", ms=3, color=color, label=label)
            left.plot(layers, [r["oracle"] for r in rows], "--", color=color, alpha=0.6)
        buckets = [b for b in p.get("by_position") or [] if b["start"] > 0]
        if buckets:
            right.plot(
                [(b["start"] + b["end"]) / 2 for b in buckets], [100 * b["ppl_gap"] for b in buckets],
                "o-", color=color, label=label,
            )  # fmt: skip
    left.set_xlabel("layer")
    left.set_ylabel("attention recall (dashed: oracle top-k)")
    left.set_title("Recall per layer after the sparse stage")
    left.grid(alpha=0.3)
    left.legend(loc="lower right", fontsize=8)
    right.set_xscale("log", base=2)
    right.set_xlabel("query position (bucket middle)")
    right.set_ylabel("DSA perplexity gap over dense (%)")
    right.set_title("Where the gap is: by query position")
    right.axhline(0, color="k", lw=0.8)
    right.grid(alpha=0.3)
    right.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    png = Path(png)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def markdown_report(report: dict, title: str = "DSA evaluation") -> str:
    """Markdown tables of a :func:`report_dict` (with the optional ``after_sparse`` / ``stages`` /
    ``timings`` sections the demo adds)."""
    lines = [f"# {title}", ""]
    if "model" in report:
        lines += [f"Model: `{report['model']}`; held-out text: {report.get('data', '')}", ""]
    lines += [
        f"Held-out: {report['eval_sequences']} sequences × {report['seq_len']} tokens; top-k {report['topk']}.",
        "",
        "| | perplexity | vs dense | attention recall |",
        "|---|---|---|---|",
        f"| dense | {_fmt(report['ppl_dense'])} | | |",
        f"| DSA, {report.get('indexer', INDEXER)} | {_fmt(report['ppl_dsa'])} | {_pct(report['ppl_gap'])} | "
        f"{_fmt(report['attention_recall'])} |",
    ]
    if report.get("ppl_dsa_untrained") is not None:
        gap = report["ppl_dsa_untrained"] / report["ppl_dense"] - 1
        lines.append(
            f"| DSA, untrained indexer | {_fmt(report['ppl_dsa_untrained'])} | {_pct(gap)} | "
            f"{_fmt(report.get('attention_recall_untrained'))} |"
        )
    after = report.get("after_sparse")
    if after:
        lines.append(
            f"| DSA after the sparse stage | {_fmt(after['ppl_dsa'])} | {_pct(after['ppl_dsa'] / report['ppl_dense'] - 1)} | "
            f"{_fmt(after.get('attention_recall'))} |"
        )
        if after.get("ppl_dense") is not None:
            lines.append(
                f"| (same model, dense) | {_fmt(after['ppl_dense'])} | {_pct(after['ppl_dense'] / report['ppl_dense'] - 1)} | |"
            )
    if report.get("attention_recall_oracle") is not None or report.get("ppl_dsa_oracle") is not None:
        best = report.get("ppl_dsa_oracle")
        gap = None if best is None else best / report["ppl_dense"] - 1
        lines.append(
            f"| DSA, oracle top-k | {_fmt(best)} | {_pct(gap)} | {_fmt(report.get('attention_recall_oracle'))} |"
        )
    lines.append("")
    if after:
        lines += [
            "Gap DSA vs dense of the same model: "
            f"{_pct(report['ppl_gap'])} after warm-up → {_pct(after.get('ppl_gap_same_model'))} after the sparse stage "
            f"(vs the original dense model: {_pct(after.get('ppl_gap_vs_original'))}).",
            "",
        ]
    if len(report.get("grid", [])) > 1:
        lines += [
            "## All lengths and top-k",
            "",
            "| L | top-k | ppl dense | ppl DSA | gap | ppl oracle top-k | ppl untrained | recall | oracle | untrained recall |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for p in report["grid"]:
            lines.append(
                f"| {p['seq_len']} | {p['topk']} | {_fmt(p['ppl_dense'])} | {_fmt(p['ppl_dsa'])} | {_pct(p['ppl_gap'])} | "
                f"{_fmt(p['ppl_dsa_oracle'])} | "
                f"{_fmt(p['ppl_dsa_untrained'])} | {_fmt(p['attention_recall'])} | "
                f"{_fmt(p['attention_recall_oracle'])} | {_fmt(p['attention_recall_untrained'])} |"
            )
        lines.append("")
    if report.get("per_layer"):
        lines += [
            f"## Per layer (L={report['seq_len']}, top-{report['topk']})",
            "",
            "![recall per layer](dsa_recall.png)",
            "",
            "| layer | recall | oracle | untrained |",
            "|---|---|---|---|",
        ]
        for r in report["per_layer"]:
            lines.append(
                f"| {r['layer']} | {_fmt(r['recall'])} | {_fmt(r['oracle'])} | {_fmt(r['untrained'])} |"
            )
        lines.append("")
    if report.get("domains"):
        lines += _domain_sections(report["domains"])
    if report.get("stages"):
        lines += ["## Training", "", "| stage | steps | tokens | final indexer loss | final LM loss | time |"]
        lines.append("|---|---|---|---|---|---|")
        for name, s in report["stages"].items():
            lines.append(
                f"| {name} | {s.get('steps')} | {s.get('tokens')} | {_fmt(s.get('loss_indexer'))} | "
                f"{_fmt(s.get('loss_lm'))} | {_fmt(s.get('seconds'), 0)} s |"
            )
        lines.append("")
    if report.get("timings"):
        lines += ["Wall time: " + ", ".join(f"{k} {v:.0f} s" for k, v in report["timings"].items()), ""]
    return "\n".join(lines)


DOMAIN_NAMES = {"in_domain": "held-out, adaptation domain", "off_domain": "held out whole, other text"}


def _domain_sections(domains: dict) -> list[str]:
    """The after-sparse tables of a demo-shaped report: every domain and point (same-model gap, oracle,
    recall), the gap by query position, and the recall per layer."""
    lines = [
        "## After the sparse stage",
        "",
        "![recall per layer and gap by position after the sparse stage](dsa_final.png)",
        "",
        "Perplexity of the trained model with dense attention and with DSA; the oracle top-k attends to "
        "the k keys with the most dense attention (the best any indexer could select).",
        "",
        "| text | L | top-k | sequences | ppl dense | ppl DSA | gap | ppl oracle top-k | oracle gap | recall | oracle recall |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for domain, d in domains.items():
        name = f"{DOMAIN_NAMES.get(domain, domain)} ({d.get('source')})"
        for p in d.get("after_sparse", []):
            oracle = p.get("ppl_dsa_oracle")
            lines.append(
                f"| {name} | {p['seq_len']} | {p['topk']} | {p['sequences']} | {_fmt(p['ppl_dense'])} | "
                f"{_fmt(p['ppl_dsa'])} | {_pct(p['ppl_gap'])} | {_fmt(oracle)} | "
                f"{_pct(None if oracle is None else oracle / p['ppl_dense'] - 1)} | "
                f"{_fmt(p.get('attention_recall'))} | {_fmt(p.get('attention_recall_oracle'))} |"
            )
    lines.append("")
    rows = [
        (domain, p)
        for domain, d in domains.items()
        for p in d.get("after_sparse", [])
        if p.get("by_position")
    ]
    if rows:
        lines += [
            "### Where the gap is: by query position",
            "",
            "Queries before position k see at most k keys, so DSA is exact there; the gap is made further on.",
            "",
            "| text | L / top-k | positions | ppl dense | ppl DSA | gap | oracle gap |",
            "|---|---|---|---|---|---|---|",
        ]
        for domain, p in rows:
            for b in p["by_position"]:
                oracle = b.get("ppl_dsa_oracle")
                lines.append(
                    f"| {DOMAIN_NAMES.get(domain, domain)} | {p['seq_len']} / {p['topk']} | {b['start']}–{b['end']} | "
                    f"{_fmt(b['ppl_dense'])} | {_fmt(b['ppl_dsa'])} | {_pct(b['ppl_gap'])} | "
                    f"{_pct(None if oracle is None else oracle / b['ppl_dense'] - 1)} |"
                )
        lines.append("")
    cols = [
        (domain, p) for domain, d in domains.items() for p in d.get("after_sparse", []) if p.get("per_layer")
    ]
    if cols:
        head = " | ".join(
            f"{'in' if dm == 'in_domain' else 'off'} {p['seq_len']}/{p['topk']} recall | oracle"
            for dm, p in cols
        )
        lines += [
            "### Where the gap is: recall per layer",
            "",
            f"| layer | {head} |",
            "|---|" + "---|---|" * len(cols),
        ]
        by_layer: dict[int, list[str]] = {}
        for _, p in cols:
            for r in p["per_layer"]:
                by_layer.setdefault(r["layer"], []).extend([_fmt(r["recall"]), _fmt(r["oracle"])])
        for layer, cells in sorted(by_layer.items()):
            lines.append(f"| {layer} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def write_report(
    out_dir: str | Path, report: dict, points: list[EvalPoint], title: str = "DSA evaluation"
) -> Path:
    """Write ``dsa_report.json``, ``dsa_recall.png``, ``dsa_report.md`` (and, for a demo-shaped report,
    ``dsa_final.png``: :func:`plot_final`) under ``out_dir``; returns the Markdown path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dsa_report.json").write_text(json.dumps(report, indent=2) + "\n")
    plot_recall(points, out / "dsa_recall.png", report.get("indexer", INDEXER))
    if report.get("domains"):
        plot_final(report["domains"], out / "dsa_final.png")
    md = out / "dsa_report.md"
    md.write_text(markdown_report(report, title) + "\n")
    return md
