"""``run(settings)``: one benchmark, one model, every ``(problem, sample)`` pair, scored and written.

1. The benchmark's problems (``--subset``, ``--data``, the first ``--limit``), the solver (a local
   model is loaded here) and the paper row are made ready before anything is written, so a bad input
   leaves no directory behind.
2. The run directory (default ``runs/eval/<model>/<benchmark>``) is locked for the whole run
   (``fcntl.flock`` on its ``.lock`` file, without waiting): a second run on the same directory at
   the same time stops at once with :class:`~dsv32.eval.errors.RunDirectoryBusy`. It holds
   ``settings.json``; a directory whose settings differ in anything that changes a sample
   (:data:`~dsv32.eval.settings.IDENTITY`) is refused unless ``fresh``. ``samples.jsonl`` is read
   back and only the missing pairs run. A sample counts for its problem only while the problem is
   what it was when the sample was made (:func:`~dsv32.eval.samples.problem_hash`, kept on every
   line): a problem edited in a ``--data`` file since then (or one whose package changed it) is run
   again, with a warning, and its old lines stay in the file but count for nothing.
3. Single-turn: each reply is scored in a pool of threads as soon as it arrives (an endpoint's
   one by one, ``concurrency`` requests at a time; a local model's a batch at a time; each HumanEval
   program is its own sandboxed process). Episodes: ``concurrency`` episodes at a time, each with its
   own backend. Each sample is appended to ``samples.jsonl`` as soon as it is scored, and the progress
   bar moves with it.
4. A sample whose endpoint call failed (after the client's retries) is not written, and not counted
   as a wrong answer: ``results.json`` and ``report.md`` are still written, marked incomplete, with
   every unscored ``(problem, sample)`` and its error under ``missing``; the run then ends with an
   error that lists them, and running the same command again retries just those (for a request
   refused for its length, the error says what to change instead: a rerun would meet it again). (A
   local model that fills its window fails its episode like any wrong answer.)
5. ``results.json`` and ``report.md`` (:mod:`dsv32.eval.report`).

:func:`rescore` grades a finished single-turn run's samples again with the scorer of the code that
runs now (``dsv32 eval rescore DIR``): the completions stay as they were made, and ``results.json``
keeps the date, commit and wall time of their making with a ``rescored`` record beside them.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from dsv32.eval import registry
from dsv32.eval.errors import EvalError, RunDirectoryBusy
from dsv32.eval.paper import paper_number
from dsv32.eval.report import git_commit, load_results, utc_now, write_results
from dsv32.eval.samples import SampleWriter, problem_hash, read_samples, sample_line
from dsv32.eval.settings import IDENTITY, PAPER_CONTEXT, RunSettings
from dsv32.eval.solvers import EndpointSolver, LocalSolver, ReferenceSolver
from dsv32.eval.types import Benchmark, Problem, RunOptions, Score
from dsv32.jsonl import read_json
from dsv32.paths import lock_directory
from dsv32.runlog import write_text

log = logging.getLogger(__name__)
SCORE_WORKERS = 2


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", Path(text).name if "/" in text else text).strip("_") or "model"


def default_out(settings: RunSettings) -> Path:
    return Path("runs") / "eval" / slug(settings.model) / settings.benchmark


def make_solver(settings: RunSettings, bench: Benchmark) -> Any:
    if settings.backend == "reference":
        return ReferenceSolver(bench)
    if settings.backend == "openai":
        return EndpointSolver(
            settings.base_url or "",
            settings.model,
            settings.concurrency,
            timeout_s=settings.request_timeout_s,
            max_retries=settings.max_retries,
        )
    if settings.backend == "local":
        if settings.concurrency > 1:
            raise EvalError(
                "--concurrency is for endpoints; a local model batches single-turn problems with --batch-size"
            )
        return LocalSolver(settings.model, settings.batch_size, dtype=settings.dtype)
    raise EvalError(f"unknown backend {settings.backend!r}; choose reference, local or openai")


def prepare(settings: RunSettings) -> tuple[Benchmark, list[Problem], dict | None]:
    """The benchmark, its problems for this run and the paper row: everything checked, nothing written."""
    bench = registry.get(settings.benchmark)
    if hasattr(bench, "exec_timeout_s"):  # a benchmark that runs programs: --exec-timeout
        bench.exec_timeout_s = settings.exec_timeout_s
    if settings.data is not None and not Path(settings.data).is_file():
        raise EvalError(f"--data {settings.data}: no such file")
    if settings.data is not None and not (bench.needs_data or bench.reads_data):
        raise EvalError(f"{bench.name} takes no --data: its problems come from {bench.source}")
    if settings.subset and not bench.subsets():
        raise EvalError(f"{bench.name} has no subsets to pick with --subset")
    paper = paper_number(settings.paper, bench.name, settings.thinking) if settings.paper else None
    problems = bench.problems(settings.subset or None, settings.data)
    if settings.limit is not None:
        problems = problems[: settings.limit]
    if not problems:
        raise EvalError(f"{bench.name} has no problems for these settings")
    return bench, problems, paper


@contextmanager
def _locked(out: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``out`` (created if need be) or raise :class:`RunDirectoryBusy` at
    once (:func:`dsv32.paths.lock_directory`)."""
    out.mkdir(parents=True, exist_ok=True)
    handle = lock_directory(out)
    if handle is None:
        raise RunDirectoryBusy(str(out))
    with handle:
        yield


def _open_dir(out: Path, settings: RunSettings, fresh: bool) -> list[dict]:
    saved = out / "settings.json"
    if saved.is_file() and not fresh:
        before = read_json(saved, EvalError, "pass --fresh to start over or another --out")
        if not isinstance(before, dict):
            raise EvalError(f"{saved}: not a run's settings (a JSON object); pass --fresh or another --out")
        now = settings.identity()
        keys = [*now, *(k for k in IDENTITY if k in before and k not in now)]  # a setting now at its default
        changed = {k: (before.get(k), now.get(k)) for k in keys if before.get(k) != now.get(k)}
        if changed:
            listed = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in sorted(changed.items()))
            raise EvalError(
                f"{out} holds a run with other settings ({listed}); "
                "pass --fresh to start over or another --out"
            )
    out.mkdir(parents=True, exist_ok=True)
    if fresh:
        for name in ("samples.jsonl", "results.json", "report.md"):
            (out / name).unlink(missing_ok=True)
    saved.write_text(json.dumps(settings.identity(), indent=1), encoding="utf-8")
    return read_samples(out / "samples.jsonl")


def _single_row(problem: Problem, j: int, gen: Any, score: Any) -> dict:
    return {
        "id": problem.id,
        "sample": j,
        "problem_hash": problem_hash(problem),
        "subset": problem.subset,
        "prompt": problem.messages,
        "completion": gen.message,
        "score": score.value,
        "reason": score.reason,
        "prompt_tokens": gen.prompt_tokens,
        "completion_tokens": gen.completion_tokens,
        "latency_s": round(gen.latency_s, 4),
        "finish_reason": gen.finish_reason,
        **({"secondary": score.secondary} if score.secondary else {}),
    }


def _score(bench: Benchmark, problem: Problem, message: dict) -> Score:
    """``bench.score``, except that a scorer that raises on a completion grades it 0 with the error
    as the reason (logged too): one odd completion never ends a run, and a resumed run would only
    meet it again."""
    try:
        return bench.score(problem, message)
    except Exception as err:  # any scorer failure is this sample's grade, not the run's end
        why = f"not scored: the scorer raised {type(err).__name__}: {' '.join(str(err).split())}"[:300]
        log.warning("%s %s: %s", bench.name, problem.id, why)
        return Score(0.0, why)


def _replies(solver: Any, pending: list, settings: RunSettings) -> Iterator[tuple[Any, Any]]:
    """``((problem, sample), reply)`` in the order the replies come: one by one from a solver that
    streams them, else a chunk (``solver.chunk_size``: a local model's batch) at a time."""
    if hasattr(solver, "stream"):
        yield from solver.stream(pending, settings)
        return
    for start in range(0, len(pending), solver.chunk_size):
        chunk = pending[start : start + solver.chunk_size]
        yield from zip(chunk, solver.complete(chunk, settings))


def _run_single(bench, solver, settings, pending, writer, tick) -> dict[tuple[str, int], str]:
    failed: dict[tuple[str, int], str] = {}

    def finish(problem: Problem, j: int, gen: Any) -> None:
        writer.write(_single_row(problem, j, gen, _score(bench, problem, gen.message)))
        tick()

    with ThreadPoolExecutor(SCORE_WORKERS) as pool:
        scoring = []
        for (problem, j), gen in _replies(solver, pending, settings):
            if gen.error is not None:
                failed[(problem.id, j)] = gen.error
            else:
                scoring.append(pool.submit(finish, problem, j, gen))
        for future in scoring:
            future.result()
    return failed


def _run_episodes(bench, solver, settings, pending, writer, tick) -> dict[tuple[str, int], str]:
    options = RunOptions(
        settings.thinking, settings.sampling(), settings.context, settings.context_window, settings.max_steps
    )

    def one(item: tuple[Problem, int]) -> str | None:
        problem, j = item
        start = time.perf_counter()
        result = bench.episode(problem, solver.episode_backend(problem), options)
        if result.stop_reason == "error" and settings.backend == "openai":
            return result.score.reason  # the endpoint failed: retried on the next run, not scored
        writer.write(
            {
                "id": problem.id,
                "sample": j,
                "problem_hash": problem_hash(problem),
                "subset": problem.subset,
                "prompt": problem.messages,
                "completion": result.final,
                "score": result.score.value,
                "reason": result.score.reason,
                "steps": result.steps,
                "tokens": result.tokens,
                "resets": result.resets,
                "stop_reason": result.stop_reason,
                "latency_s": round(time.perf_counter() - start, 4),
                "messages": result.messages,
            }
        )
        tick()
        return None

    workers = settings.concurrency if settings.backend != "local" else 1
    with ThreadPoolExecutor(workers) as pool:
        errors = list(pool.map(one, pending))
    return {(p.id, j): e for (p, j), e in zip(pending, errors) if e is not None}


def run(
    settings: RunSettings,
    out: str | Path | None = None,
    *,
    fresh: bool = False,
    progress: bool = True,
    solver: Any = None,
    on_ready: Callable[[Path], None] | None = None,
) -> dict:
    """Run ``settings.benchmark`` and return the results (also written under ``out``)."""
    bench, problems, paper = prepare(settings)
    solver = solver or make_solver(settings, bench)
    if settings.context_window is None:
        window = getattr(solver, "window", None) or PAPER_CONTEXT
        settings = replace(settings, context_window=min(PAPER_CONTEXT, window))
    note = solver.budget_note(settings.max_tokens) if hasattr(solver, "budget_note") else None
    if note:
        log.info("%s", note)
    out = Path(out) if out is not None else default_out(settings)
    with _locked(out):
        return _run_locked(settings, bench, problems, paper, solver, out, fresh, progress, on_ready)


def _run_locked(settings, bench, problems, paper, solver, out, fresh, progress, on_ready) -> dict:
    done_rows = _open_dir(out, settings, fresh)
    if on_ready is not None:
        on_ready(out)
    hashes = {p.id: problem_hash(p) for p in problems}

    def current(row: dict) -> bool:
        return row.get("id") in hashes and row.get("problem_hash") == hashes[row["id"]]

    done = {(r["id"], r["sample"]) for r in done_rows if current(r)}
    changed = sorted(
        {r["id"] for r in done_rows if r.get("id") in hashes and not current(r)} - {i for i, _ in done}
    )
    if changed:
        log.warning(
            "%s: %d problem(s) changed since their samples in %s were made (%s); running them again",
            bench.name,
            len(changed),
            out / "samples.jsonl",
            ", ".join(changed[:5]) + (", ..." if len(changed) > 5 else ""),
        )
    pending = [(p, j) for p in problems for j in range(settings.n) if (p.id, j) not in done]
    start, commit = time.perf_counter(), git_commit()  # the code that runs is the code at the start
    from tqdm import tqdm

    bar = tqdm(
        total=len(problems) * settings.n,
        initial=len(done),
        desc=bench.name,
        unit="sample",
        disable=not progress,
        dynamic_ncols=True,
    )
    writer = SampleWriter(out / "samples.jsonl")
    try:
        runner = _run_single if bench.kind == "single" else _run_episodes
        ticking = threading.Lock()

        def tick() -> None:
            with ticking:
                bar.update(1)

        failed = runner(bench, solver, settings, pending, writer, tick)
    finally:
        writer.close()
        bar.close()
    rows = [r for r in read_samples(out / "samples.jsonl") if current(r)]
    results = write_results(
        out, bench, settings, problems, rows, paper, time.perf_counter() - start, commit, failed
    )
    if results["incomplete"]:
        raise EvalError(_incomplete_message(results, out, sorted(getattr(solver, "advice", ()))))
    return results


def rescore(out: str | Path) -> dict:
    """Grade the samples of the finished run in ``out`` again with the benchmark's scorer as it is
    now, rewrite ``samples.jsonl`` (each line's ``score``, ``reason`` and ``secondary``; its
    completion untouched) and ``results.json`` / ``report.md``, and return the new results.

    Only single-turn benchmarks: an episode's grade depends on the environment's state during the
    episode, which a sample file does not hold. The run's settings are read from its ``results.json``;
    a sample of a problem that changed since it was made counts for nothing, as in :func:`run`."""
    out = Path(out)
    before = load_results(out)
    saved = before.get("settings")
    if not isinstance(saved, dict) or not isinstance(saved.get("benchmark"), str):
        raise EvalError(f"{out}/results.json: no run settings in it; not a 'dsv32 eval run' directory")
    settings = RunSettings(**{k: v for k, v in saved.items() if k in RunSettings.__dataclass_fields__})
    bench, problems, paper = prepare(settings)
    if bench.kind != "single":
        raise EvalError(
            f"{bench.name} is graded on the environment's state during each episode, which samples.jsonl "
            "does not hold; run it again instead (dsv32 eval run ... --fresh)"
        )
    by_id = {p.id: p for p in problems}
    with _locked(out):
        rows = read_samples(out / "samples.jsonl")
        hashes = {i: problem_hash(p) for i, p in by_id.items()}
        scoring = [r for r in rows if r.get("id") in hashes and r.get("problem_hash") == hashes[r["id"]]]
        start = time.perf_counter()

        def grade(row: dict) -> bool:
            message = row.get("completion")
            score = _score(bench, by_id[row["id"]], message if isinstance(message, dict) else {})
            changed = score.value != row.get("score")
            row["score"], row["reason"] = score.value, score.reason
            row.pop("secondary", None)
            if score.secondary:
                row["secondary"] = score.secondary
            return changed

        with ThreadPoolExecutor(SCORE_WORKERS) as pool:
            changed = sum(pool.map(grade, scoring))
        write_text(out / "samples.jsonl", "".join(map(sample_line, rows)))
        record = {
            "date": utc_now(),
            "git_commit": git_commit(),
            "samples": len(scoring),
            "changed": changed,
            "before": before.get("metrics", {}).get("pass@1", {}).get("value"),
            "elapsed_s": round(time.perf_counter() - start, 2),
        }
        return write_results(
            out,
            bench,
            settings,
            problems,
            scoring,
            paper,
            float(before.get("elapsed_s") or 0.0),
            str(before.get("git_commit") or "unknown"),
            date=before.get("date"),
            rescored=record,
        )


def _incomplete_message(results: dict, out: Path, advice: list[str] = (), shown: int = 20) -> str:
    """What an incomplete run tells its user: the counts, what to change when a rerun cannot help
    (``advice``: requests refused for their length), then the unscored samples (the first ``shown``;
    all of them are under ``missing`` in results.json)."""
    missing, selected = results["missing"], results["selected"]
    retry = (
        "requests refused for their length are refused again by the same command: "
        + "; or ".join(advice)
        + ", then run it again to retry them:"
        if advice
        else "run the same command again to retry them:"
    )
    lines = [
        f"{len(missing)} of {selected['samples']} sample(s) have no scored result "
        f"({selected['problems'] - results['problems']} of {selected['problems']} problem(s) none at all); "
        f"{out}/results.json and report.md are marked INCOMPLETE and list every one under 'missing'; " + retry
    ]
    lines += [f"  {m['id']} #{m['sample']}: {m['error']}" for m in missing[:shown]]
    if len(missing) > shown:
        lines.append(f"  ... and {len(missing) - shown} more (results.json 'missing')")
    return "\n".join(lines)
