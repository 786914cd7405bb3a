"""The pages of each kind of thing a run leaves: episodes (a trajectory, a ``dsv32 envs run``
directory of trajectories with their rewards, a JSONL of episodes or conversations), an evaluation run
directory and a post-training run directory. Each returns ``(title, subtitle, body HTML, data)`` for
:func:`dsv32.view.page.page`."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from dsv32.jsonl import read_json, read_jsonl, read_log
from dsv32.view.curves import charts, line_chart, series
from dsv32.view.episode import Episode, episode_html, from_messages, from_sample, from_trajectory, passed
from dsv32.view.errors import ViewError
from dsv32.view.page import badge, cards, esc, number, samples_table

Page = tuple[str, str, str, Any]
STAGES = ("base", "sft", "rl")
STAGE_NAMES = {"base": "base", "sft": "cold-start SFT", "rl": "agentic GRPO"}


def _short(text: Any, n: int = 120) -> str:
    s = " ".join(str(text or "").split())
    return s if len(s) <= n else s[: n - 1] + "…"


# ---------------------------------------------------------------------------------------------- episodes
def episodes_page(episodes: list[Episode], title: str, subtitle: str) -> Page:
    """One episode shown whole; several as a filterable table whose rows open their episode."""
    if len(episodes) == 1:
        return title, subtitle, episode_html(episodes[0]), {"kind": "episode", "episodes": 1}
    rows = []
    for i, ep in enumerate(episodes):
        cells = [esc(i), esc(ep.title), badge(ep.passed), esc(number(ep.score)), esc(_short(ep.reason, 80)),
                 esc(ep.stop_reason or "–"), esc(number(ep.tokens.get("total")))]  # fmt: skip
        text = " ".join(str(x or "") for x in (ep.title, ep.reason, ep.stop_reason, ep.final))
        rows.append((cells, ep.passed, text, episode_html(ep)))
    headers = ["#", "episode", "passed", "score", "reason", "stop", "tokens"]
    solved = sum(bool(e.passed) for e in episodes)
    table = samples_table(headers, rows, "episode, reason, answer")
    body = cards([("episodes", len(episodes)), ("passed", solved)]) + table
    return title, subtitle, body, {"kind": "episodes", "episodes": len(episodes), "passed": solved}


def trajectory_file(path: Path) -> Page:
    """A JSON file of one episode (or of an ``eval_<stage>.json``'s sample conversations); a
    trajectory of a ``dsv32 envs run`` directory gets its reward from the run's ``results.jsonl``."""
    data = read_json(path, ViewError)
    ep = _episode_of(data, path.stem)
    if ep is None:
        raise ViewError(
            f"{path}: not an episode (a trajectory with messages, a conversation as a list of messages, "
            "an evaluation sample or an eval_<stage>.json with samples)"
        )
    if isinstance(ep, list):
        return episodes_page(ep, f"samples of {path.name}", str(path))
    results = path.parent.parent / "results.jsonl"
    if path.parent.name == "trajectories" and results.is_file() and isinstance(data, dict):
        rows = [
            r for _, r in read_jsonl(results, ViewError) if isinstance(r, dict) and r.get("id") == path.stem
        ]
        ep = from_trajectory(data, path.stem, rows[0] if rows else None)
    return episodes_page([ep], f"episode {path.stem}", str(path))


def _episode_of(data: Any, title: str) -> Episode | list[Episode] | None:
    if isinstance(data, list):
        return from_messages(data, title)
    if not isinstance(data, dict):
        return None
    if isinstance(data.get("samples"), list) and "accuracy" in data:  # eval_<stage>.json
        return [from_messages(s, f"{title} sample {i}") for i, s in enumerate(data["samples"])]
    if "score" in data and ("prompt" in data or "messages" in data):
        return from_sample(data, f"{data.get('id', title)} #{data.get('sample', 0)}")
    if isinstance(data.get("messages"), list):
        return from_trajectory(data, title, data if "reward" in data else None)
    return None


def jsonl_file(path: Path) -> Page:
    """A JSONL of evaluation samples or of episodes (trajectories or conversations), one a line."""
    rows = [row for _, row in read_jsonl(path, ViewError)]
    if rows and all(isinstance(r, dict) and "score" in r and "id" in r for r in rows):
        return eval_samples(rows, path.name, str(path), benchmark="")
    episodes = []
    for n, row in enumerate(rows, 1):
        ep = _episode_of(row, f"{path.name}:{n}")
        if ep is None or isinstance(ep, list):
            raise ViewError(f"{path}:{n}: not an episode (a trajectory, a sample row or a list of messages)")
        episodes.append(ep)
    if not episodes:
        raise ViewError(f"{path}: no episodes in it")
    return episodes_page(episodes, path.name, str(path))


def envs_run_dir(path: Path) -> Page:
    """``dsv32 envs run --out``: ``trajectories/<id>.json`` with their rewards in ``results.jsonl``."""
    results = (
        {r.get("id"): r for _, r in read_jsonl(path / "results.jsonl", ViewError)}
        if (path / "results.jsonl").is_file()
        else {}
    )
    episodes = []
    for file in sorted((path / "trajectories").glob("*.json")):
        data = read_json(file, ViewError)
        result = results.get(file.stem)
        episodes.append(from_trajectory(data if isinstance(data, dict) else {}, file.stem, result))
    if not episodes:
        raise ViewError(f"{path}/trajectories: no trajectories in it")
    summary = read_json(path / "summary.json", ViewError) if (path / "summary.json").is_file() else {}
    env = summary.get("env", "") if isinstance(summary, dict) else ""
    return episodes_page(episodes, f"episodes{' in ' + env if env else ''}", str(path))


# ---------------------------------------------------------------------------------------------- eval
def eval_dir(path: Path) -> Page:
    """An evaluation run: ``settings.json``, ``samples.jsonl``, ``results.json``."""
    settings = read_json(path / "settings.json", ViewError) if (path / "settings.json").is_file() else {}
    settings = settings if isinstance(settings, dict) else {}
    rows = read_log(
        path / "samples.jsonl", ViewError, "the file is not an evaluation run's samples", cut=False
    )
    bench = str(settings.get("benchmark", ""))
    title, _, body, data = eval_samples(rows, f"evaluation: {bench or path.name}", str(path), benchmark=bench)
    results = read_json(path / "results.json", ViewError) if (path / "results.json").is_file() else {}
    if isinstance(results, dict) and isinstance(results.get("metrics"), dict):
        metrics = [
            (name, f"{number(m.get('value'))} [{number(m.get('ci_low'))}, {number(m.get('ci_high'))}]")
            for name, m in results["metrics"].items()
            if isinstance(m, dict)
        ]
        body = cards(metrics) + body
    model = " · ".join(str(settings[k]) for k in ("backend", "model") if settings.get(k))
    return title, " · ".join(x for x in (str(path), model) if x), body, data


def eval_samples(rows: list, title: str, subtitle: str, benchmark: str) -> Page:
    table, index = [], []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ViewError(f"{subtitle}: sample {i + 1} is not a JSON object")
        ok = passed(row.get("score"))
        ident = f"{row.get('id')} #{row.get('sample', 0)}"
        cells = [esc(ident), esc(benchmark or "–"), esc(row.get("subset") or "–"), badge(ok),
                 esc(number(row.get("score"))), esc(_short(row.get("reason"), 90))]  # fmt: skip
        text = " ".join(
            str(x or "") for x in (row.get("id"), benchmark, row.get("subset"), row.get("reason"))
        )
        table.append((cells, ok, text, episode_html(from_sample(row, ident))))
        index.append(
            {"id": row.get("id"), "sample": row.get("sample"), "passed": ok, "score": row.get("score")}
        )
    solved = sum(bool(x["passed"]) for x in index)
    headers = ["sample", "benchmark", "category", "passed", "score", "reason"]
    body = cards([("samples", len(rows)), ("passed", solved), ("failed", len(rows) - solved)])
    body += samples_table(headers, table)
    return title, subtitle, body, {"kind": "eval", "benchmark": benchmark, "samples": index}


# ---------------------------------------------------------------------------------------------- posttrain
def _json(path: Path) -> Any:
    return read_json(path, ViewError) if path.is_file() else None


def _figure(root: Path, path: Path) -> str:
    """A PNG of the run embedded as a ``data:`` URI."""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    name = path.relative_to(root).as_posix()
    image = f'<img alt="{esc(name)}" src="data:image/png;base64,{data}">'
    return f'<div class="figure"><h3>{esc(name)}</h3>{image}</div>'


def posttrain_dir(path: Path) -> Page:
    """A post-training run: the stages side by side per held-out task, the report's numbers and
    figures, the training curves, sample conversations."""
    report = _json(path / "report.json") or {}
    evals = {s: _json(path / f"eval_{s}.json") for s in STAGES}
    evals = {s: e for s, e in evals.items() if isinstance(e, dict)}
    if not evals and not report:
        raise ViewError(f"{path}: neither report.json nor eval_<stage>.json: not a post-training run")
    prompts = {}
    if (path / "tasks_heldout.jsonl").is_file():
        prompts = {
            r.get("id"): r.get("prompt") for _, r in read_jsonl(path / "tasks_heldout.jsonl", ViewError)
        }
    body = [_headline(report, evals)]
    body.append("<h2>Held-out tasks, stage by stage</h2>" + _task_table(evals, prompts))
    body.append("<h2>Training curves</h2>" + _curves(path))
    figures = [
        p for p in (path / "report.png", path / "sft" / "sft.png", path / "rl" / "rl.png") if p.is_file()
    ]
    if figures:
        body.append("<h2>Figures</h2>" + "".join(_figure(path, p) for p in figures))
    for stage, summary in evals.items():
        samples = summary.get("samples") or []
        if samples:
            episodes = "".join(
                episode_html(from_messages(s, f"{STAGE_NAMES[stage]}: sample {i}"))
                for i, s in enumerate(samples)
            )
            body.append(
                f"<details><summary>sample conversations after {esc(STAGE_NAMES[stage])}</summary>"
                f"{episodes}</details>"
            )
    details = report.get("details") if isinstance(report.get("details"), dict) else {}
    subtitle = " · ".join(str(x) for x in (path, details.get("model"), details.get("task")) if x)
    data = {"kind": "posttrain", "stages": list(evals), "tasks": len(prompts) or None}
    return "post-training run", subtitle, "".join(body), data


def _headline(report: dict, evals: dict[str, dict]) -> str:
    items = []
    for s in STAGES:
        acc = report.get(f"accuracy_{s}", (evals.get(s) or {}).get("accuracy"))
        if acc is not None:
            lo, hi = (report.get(f"interval_{s}") or [None, None])[:2]
            interval = f" [{number(lo)}, {number(hi)}]" if lo is not None else ""
            items.append((f"accuracy · {STAGE_NAMES[s]}", f"{number(acc)}{interval}"))
    for key, label in (
        ("heldout_tasks", "held-out tasks"),
        ("rl_gain", "GRPO − SFT"),
        ("minutes", "minutes"),
    ):
        if report.get(key) is not None:
            items.append((label, number(report[key])))
    return cards(items)


def _task_table(evals: dict[str, dict], prompts: dict) -> str:
    outcomes = {
        s: {o.get("id"): o for o in e.get("outcomes") or [] if isinstance(o, dict)} for s, e in evals.items()
    }
    ids = list(dict.fromkeys([*prompts, *(i for o in outcomes.values() for i in o)]))
    if not ids:
        return "<p>no per-task outcomes in this run</p>"
    rows = []
    for task in ids:
        cells, results = [esc(task), esc(_short(prompts.get(task), 100))], []
        for s in evals:
            o = outcomes[s].get(task)
            ok = None if o is None else bool(o.get("correct"))
            results.append(ok)
            note = (
                ""
                if o is None
                else f" <span class=meta>{esc(o.get('steps'))} calls · {esc(o.get('stop'))}</span>"
            )
            cells.append(badge(ok, "solved", "not solved") + note)
        final = results[-1] if results else None
        detail = f"<pre>{esc(prompts.get(task, ''))}</pre>"
        rows.append((cells, final, f"{task} {prompts.get(task, '')}", detail))
    headers = ["task", "prompt", *(STAGE_NAMES[s] for s in evals)]
    return samples_table(headers, rows, "task, prompt")


def _curves(path: Path) -> str:
    sft = read_log(path / "sft" / "metrics.jsonl", ViewError, "", cut=False)
    rl = read_log(path / "rl" / "metrics.jsonl", ViewError, "", cut=False)
    held = read_log(path / "rl" / "eval.jsonl", ViewError, "", cut=False)
    out = charts(sft, [("SFT loss", ["loss", "eval_loss"])])
    out += charts(
        rl, [("GRPO reward", ["reward_mean"]), ("GRPO accuracy", ["accuracy"]), ("GRPO KL", ["kl"])]
    )
    out += line_chart("held-out during GRPO", {"accuracy": series(held, "accuracy")})
    return f'<div class="charts">{out}</div>' if out else "<p>no metrics.jsonl in sft/ or rl/</p>"
