"""``results.json``, ``report.md`` and the side-by-side table of several runs.

``results.json``: ``benchmark`` (name, description, source, package versions), ``model`` (backend,
name, endpoint), ``settings``, ``date`` (UTC), ``git_commit``, ``metrics`` (``pass@1`` and, with
n > 1, ``pass@k`` for k = 2, 4, ... n, each a value in [0, 1] with its 95 % interval, see
:mod:`dsv32.eval.metrics`), ``subsets`` (the same per category or task family), ``agentic`` (mean
steps, tokens and context resets per episode), ``tokens`` (mean completion tokens per sample),
``excluded`` (problems the benchmark left out, with why), ``paper`` (the paper's number for
``--paper``), ``problems`` and ``samples`` (those with a scored result, which the metrics cover),
``selected`` (``problems`` and ``samples`` the settings asked for: problems × n), ``incomplete``
(true when some selected sample has no scored result), ``missing`` (each such sample: ``id``,
``sample`` and the ``error`` that left it unscored), ``problem_set`` (:func:`problem_set`: which
problems were selected), ``elapsed_s`` (this invocation's wall time), ``rescored`` (only when the
samples were graded again by ``dsv32 eval rescore``: its ``date``, ``git_commit``, ``samples``,
``changed`` and the pass@1 ``before``) and, for the BFCL
benchmarks, ``bfcl`` (BFCL's own group scores, :mod:`dsv32.eval.bfcl.groups`).
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path

from dsv32.eval.errors import EvalError
from dsv32.eval.metrics import default_ks, summarize
from dsv32.eval.samples import canonical_digest, first_of_each, problem_hash
from dsv32.eval.settings import RunSettings
from dsv32.eval.types import Benchmark, Problem


def git_commit() -> str:
    here = Path(__file__).resolve().parent
    try:
        done = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def _metrics(per_problem: dict[str, list[float]], n: int) -> dict:
    return {k: m.to_dict() for k, m in summarize(list(per_problem.values()), default_ks(n)).items()}


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 3) if values else None


def aggregate(problems: list[Problem], rows: list[dict], n: int, bench: Benchmark | None = None) -> dict:
    """Metrics overall and per subset over the samples of ``problems``, each ``(id, sample)`` once
    (the first of its lines), and ``bench``'s :meth:`~dsv32.eval.types.Benchmark.subset_summaries`."""
    rows = first_of_each(rows)
    counted = [r for r in rows if r["sample"] < n]
    by_problem: dict[str, list[float]] = defaultdict(list)
    for row in sorted(counted, key=lambda r: (r["id"], r["sample"])):
        by_problem[row["id"]].append(float(row["score"]))
    subset_of = {p.id: p.subset for p in problems}
    subsets: dict[str, dict[str, list[float]]] = defaultdict(dict)
    for pid, scores in by_problem.items():
        if subset_of.get(pid):
            subsets[subset_of[pid]][pid] = scores
    per_subset = {name: _metrics(s, n) for name, s in sorted(subsets.items())}
    episodes = [r for r in rows if "steps" in r]
    out = {
        "metrics": _metrics(by_problem, n),
        "subsets": per_subset if len(per_subset) > 1 else {},
        "tokens": {
            "completion_mean": _mean([r["completion_tokens"] for r in rows if "completion_tokens" in r])
        },
        "problems": len(by_problem),
        "samples": sum(len(s) for s in by_problem.values()),
        # how the scored replies ended: a single-turn reply's finish_reason ("length": cut at
        # max_tokens), an episode's stop reason ("context", "max_steps", ...)
        "endings": dict(
            sorted(Counter(str(r.get("stop_reason", r.get("finish_reason"))) for r in counted).items())
        ),
    }
    secondary = sorted({name for r in counted for name in r.get("secondary") or {}})
    if secondary:
        out["secondary"] = {name: _secondary(counted, name, n) for name in secondary}
    if episodes:
        out["agentic"] = {k + "_mean": _mean([r[k] for r in episodes]) for k in ("steps", "tokens", "resets")}
    if bench is not None:
        out |= bench.subset_summaries(per_subset)
    return out


def _secondary(rows: list[dict], name: str, n: int) -> dict:
    """The metrics of one secondary reading (a row without it counts its headline score)."""
    by_problem: dict[str, list[float]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: (r["id"], r["sample"])):
        by_problem[row["id"]].append(float((row.get("secondary") or {}).get(name, row["score"])))
    return _metrics(by_problem, n)


NOT_RUN = "no scored result (not run)"


def completeness(
    problems: list[Problem], rows: list[dict], n: int, failed: dict[tuple[str, int], str] | None = None
) -> dict:
    """``selected`` (problems and samples asked for), ``incomplete`` and ``missing``: every selected
    ``(problem, sample)`` without a scored row, with the error that left it unscored (``failed``,
    keyed by ``(id, sample)``; otherwise :data:`NOT_RUN`)."""
    failed = failed or {}
    scored = {(r["id"], r["sample"]) for r in rows}
    missing = [
        {"id": p.id, "sample": j, "error": failed.get((p.id, j), NOT_RUN)}
        for p in problems
        for j in range(n)
        if (p.id, j) not in scored
    ]
    return {
        "selected": {"problems": len(problems), "samples": len(problems) * n},
        "incomplete": bool(missing),
        "missing": missing,
    }


def write_results(
    out: Path,
    bench: Benchmark,
    settings: RunSettings,
    problems: list[Problem],
    rows: list[dict],
    paper: dict | None,
    elapsed_s: float,
    commit: str,
    failed: dict[tuple[str, int], str] | None = None,
    *,
    date: str | None = None,
    rescored: dict | None = None,
) -> dict:
    """Write ``results.json`` and ``report.md`` under ``out`` (``commit``: the code's git commit when
    the run started; ``failed``: the error of each ``(id, sample)`` this invocation could not score;
    ``date``: when the samples were made, now by default; ``rescored``: what re-grading the samples
    changed, see :func:`dsv32.eval.runner.rescore`) and return the results."""
    results = {
        "benchmark": {
            "name": bench.name,
            "description": bench.description,
            "source": bench.source,
            "metric": bench.metric,
            "versions": bench.versions(),
        },
        "model": {"backend": settings.backend, "name": settings.model, "base_url": settings.base_url},
        "settings": settings.to_dict(),
        "date": date or utc_now(),
        "git_commit": commit,
        **({"rescored": rescored} if rescored else {}),
        **aggregate(problems, rows, settings.n, bench),
        **completeness(problems, rows, settings.n, failed),
        "problem_set": problem_set(problems),
        "excluded": dict(bench.excluded),
        "paper": paper,
        "elapsed_s": round(elapsed_s, 2),
    }
    (out / "results.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    (out / "report.md").write_text(render(results), encoding="utf-8")
    return results


def utc_now() -> str:
    """The time of day as ``results.json`` records it (UTC, ISO 8601, seconds)."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def _rescored(r: dict) -> str:
    before = (
        f" (pass@1 {100 * r['before']:.1f} % before)" if isinstance(r.get("before"), (int, float)) else ""
    )
    return (
        f"graded again {r['date']} at commit {r['git_commit'][:12]}: "
        f"{r['changed']} of {r['samples']} sample score(s) changed{before}"
    )


def pct(metric: dict | None) -> str:
    if not metric:
        return "-"
    return f"{100 * metric['value']:.1f} [{100 * metric['ci_low']:.1f}, {100 * metric['ci_high']:.1f}]"


def label(results: dict, name: str) -> str:
    """``pass@1`` is called accuracy on exact-answer benchmarks (it is the mean score over samples)."""
    metric = results["benchmark"].get("metric", "pass@1")
    return f"{metric} (pass@1)" if name == "pass@1" and metric != "pass@1" else name


def render(results: dict) -> str:
    """The Markdown report of one run."""
    b, m, s = results["benchmark"], results["model"], results["settings"]
    lines = [
        f"# {b['name']}: {m['name']} ({m['backend']})",
        "",
        *([f"**{incomplete_note(results)}**", ""] if results.get("incomplete") else []),
        b["description"],
        "",
        f"- data: {b['source']} {b['versions'] or ''}".rstrip(),
        f"- settings: n={s['n']}, temperature={s['temperature']}, top_p={s['top_p']}, "
        f"max_tokens={s['max_tokens']}, "
        f"thinking={'on' if s['thinking'] else 'off'}, context={s['context']}",
        f"- {_counts(results)}; {results['date']}; commit {results['git_commit'][:12]}",
        *([f"- {_rescored(results['rescored'])}"] if results.get("rescored") else []),
        *(
            [f"- {_endings(results['endings'], bool(results.get('agentic')))}"]
            if results.get("endings")
            else []
        ),
        "",
        "| metric | score % [95 % CI] |" + (" paper % |" if results.get("paper") else ""),
        "|---|---|" + ("---|" if results.get("paper") else ""),
    ]
    for name, metric in results["metrics"].items():
        paper = results.get("paper")
        extra = (
            f" {paper['value']:.1f} ({paper['source']}) |"
            if paper and name == "pass@1"
            else (" |" if paper else "")
        )
        lines.append(f"| {label(results, name)} | {pct(metric)} |{extra}")
    for name, metrics in (results.get("secondary") or {}).items():
        lines.append(
            f"| {name} (secondary, not the benchmark's score) | {pct(metrics.get('pass@1'))} |"
            + (" |" if results.get("paper") else "")
        )
    if results["subsets"]:
        lines += ["", "| subset | problems | pass@1 % [95 % CI] |", "|---|---|---|"]
        for name, metrics in results["subsets"].items():
            lines.append(f"| {name} | {metrics['pass@1']['problems']} | {pct(metrics['pass@1'])} |")
    if results.get("bfcl"):
        lines += _bfcl_table(results["bfcl"])
    if results.get("agentic"):
        a = results["agentic"]
        lines += [
            "",
            f"Per episode: {a['steps_mean']} steps, {a['tokens_mean']} tokens, "
            f"{a['resets_mean']} context resets.",
        ]
    if results["excluded"]:
        lines += ["", f"Left out ({len(results['excluded'])}):"] + [
            f"- {k}: {v}" for k, v in results["excluded"].items()
        ]
    if results.get("missing"):
        lines += ["", f"Not scored ({len(results['missing'])}; not counted, retried by running again):"] + [
            f"- {m['id']} #{m['sample']}: {m['error']}" for m in results["missing"]
        ]
    return "\n".join(lines) + "\n"


def _bfcl_table(groups: dict) -> list[str]:
    lines = [
        "",
        "The accuracy above is the mean over all entries, so large categories weigh most. BFCL's "
        "leaderboard numbers are its group scores, each from per-category accuracies "
        "(weighted: by entry count; unweighted: mean of the categories):",
        "",
        "| BFCL group | score % | how | categories | BFCL counts, not run |",
        "|---|---|---|---|---|",
    ]
    for name, g in groups.items():
        if isinstance(g, dict):
            lines.append(
                f"| {name} | {100 * g['accuracy']:.1f} | {g['method']} | {', '.join(g['categories'])} "
                f"| {', '.join(g['missing']) or '-'} |"
            )
    if "overall" in groups:
        lines += ["", f"BFCL overall: {groups['overall']}."]
    return lines


def _endings(endings: dict[str, int], episodes: bool) -> str:
    """One line of counts by reason, e.g. ``replies ended: length: 3 (cut at max_tokens), stop: 37``
    (``episodes ended: answer: 9, context: 1 (the window was full)`` for episodes)."""
    notes = {"length": " (cut at max_tokens)", "context": " (the window was full)"}
    parts = [f"{k}: {v}{notes.get(k, '')}" for k, v in endings.items()]
    return f"{'episodes' if episodes else 'replies'} ended: " + ", ".join(parts)


def _counts(results: dict) -> str:
    selected = results.get("selected")
    if not selected:
        return f"{results['problems']} problems, {results['samples']} samples"
    return (
        f"{results['problems']} of {selected['problems']} problems, "
        f"{results['samples']} of {selected['samples']} samples scored"
    )


def incomplete_note(results: dict) -> str:
    """One line on what an incomplete run lacks: the unscored samples and problems, and the pass@k
    it cannot report."""
    selected, missing = results["selected"], results.get("missing", [])
    unscored = selected["problems"] - results["problems"]
    note = (
        f"INCOMPLETE: {len(missing)} of {selected['samples']} samples have no scored result "
        f"({unscored} of {selected['problems']} problems none at all); the scores cover only the "
        f"{results['problems']} problems and {results['samples']} samples scored"
    )
    n = results["settings"]["n"]
    absent = [f"pass@{k}" for k in default_ks(n)[1:] if f"pass@{k}" not in results["metrics"]]
    if absent and results["problems"]:
        note += f"; {', '.join(absent)} not reported (a problem has fewer scored samples than k)"
    return note + ". The unscored samples are listed below; running the same command again retries them."


def load_results(path: str | Path) -> dict:
    path = Path(path)
    file = path / "results.json" if path.is_dir() else path
    if not file.is_file():
        raise EvalError(f"{path}: no results.json (run 'dsv32 eval run' with --out {path} first)")
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise EvalError(f"{file}: not a results file ({err.msg})") from err


#: The settings that make two runs of one benchmark comparable (besides the problems themselves).
COMPARABLE = ("subset", "limit", "data", "n", "temperature", "top_p", "max_tokens", "thinking", "context")


def problem_set(problems: list[Problem]) -> str:
    """16 hex digits naming the selected problems: the digest of their ids and
    :func:`~dsv32.eval.samples.problem_hash` values, in order. Two runs with the same value asked
    the same questions."""
    return canonical_digest([[p.id, problem_hash(p)] for p in problems])[:16]


def comparability(results: dict) -> dict:
    """What must match for two runs of one benchmark to be compared: the problem count (selected),
    the problem set, the :data:`COMPARABLE` settings and whether the run is incomplete. A value an
    older results file lacks is ``None``."""
    settings = results.get("settings", {})
    return {
        "problems": (results.get("selected") or {}).get("problems", results.get("problems")),
        "problem set": results.get("problem_set"),
        **{k: settings.get(k) for k in COMPARABLE},
        "incomplete": results.get("incomplete"),
    }


def _show(value: object) -> str:
    if value is None or value == []:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def _describe(results: dict) -> tuple[str, str]:
    """The ``problems`` and ``settings`` cells of one run."""
    c = comparability(results)
    problems = _show(c["problems"])
    if results.get("incomplete"):
        problems = f"{results['problems']} of {problems} scored (INCOMPLETE)"
    settings = ", ".join(
        f"{k}={_show(Path(c[k]).name if k == 'data' and c[k] else c[k])}" for k in COMPARABLE
    )
    return problems, settings.replace("|", "\\|")


def _differences(runs: list[dict]) -> list[str]:
    """The comparability keys in which ``runs`` (of one benchmark) differ, each with every run's value
    in column order. An unknown value (an older results file) is left out of the comparison; an
    incomplete run always counts as a difference, since its scores cover only the samples it scored."""
    found = []
    described = [comparability(r) for r in runs]
    for key in described[0]:
        values = [d[key] for d in described]
        known = [v for v in values if v is not None]
        differs = any(values) if key == "incomplete" else len({json.dumps(v) for v in known}) > 1
        if differs:
            found.append(f"{key} " + " vs ".join(_show(v) for v in values))
    return found


def side_by_side(paths: list[str | Path]) -> str:
    """A Markdown table: per benchmark, a row with each run's problem count and one with the
    settings that make runs comparable (:func:`comparability`), then one row per metric (and
    subset), one column per run, then the paper's number where a run named one. Under the table, a
    ``WARNING`` line for each benchmark whose runs differ in any of those."""
    runs = [load_results(p) for p in paths]
    try:
        heads = [
            f"{r['model']['name']} ({r['model']['backend']})" + (" INCOMPLETE" if r.get("incomplete") else "")
            for r in runs
        ]
        benches = [r["benchmark"]["name"] for r in runs]
    except KeyError as err:
        raise EvalError(f"a results file lacks {err}; is it from 'dsv32 eval run'?") from err
    if len(set(heads)) < len(heads):
        heads = [f"{h}, {Path(p).name}" for h, p in zip(heads, paths)]
    rows: dict[tuple[str, str], list[str]] = {}
    papers: dict[str, str] = {}
    for i, (r, bench) in enumerate(zip(runs, benches)):
        if r.get("paper"):
            papers[bench] = f"{r['paper']['value']:.1f} ({r['paper']['source']})"
        problems, settings = _describe(r)
        rows.setdefault((bench, "problems"), [""] * len(runs))[i] = problems
        rows.setdefault((bench, "settings"), [""] * len(runs))[i] = settings
        cells = [((bench, label(r, k)), m) for k, m in r["metrics"].items()]
        cells += [
            ((bench, f"{sub}: {label(r, 'pass@1')}"), ms["pass@1"])
            for sub, ms in r.get("subsets", {}).items()
        ]
        for key, metric in cells:
            rows.setdefault(key, ["-"] * len(runs))[i] = pct(metric)
    paper_col = bool(papers)
    lines = [
        "| benchmark | metric | " + " | ".join(heads) + (" | paper (DeepSeek-V3.2) |" if paper_col else " |"),
        "|---|---|" + "---|" * (len(runs) + paper_col),
    ]
    for (bench, metric), cells in rows.items():
        overall = ":" not in metric and "pass@1" in metric
        paper = [papers.get(bench, "-") if overall else ""] if paper_col else []
        lines.append(f"| {bench} | {metric} | " + " | ".join(cells + paper) + " |")
    warnings = []
    for bench in dict.fromkeys(benches):
        same = [i for i, b in enumerate(benches) if b == bench]
        if len(same) < 2:
            continue
        differences = _differences([runs[i] for i in same])
        if differences:
            warnings.append(
                f"WARNING: {bench}: these runs are not comparable; they differ in "
                + "; ".join(differences)
                + " (values in column order)."
            )
    if warnings:
        lines += ["", *warnings]
    return "\n".join(lines) + "\n"
