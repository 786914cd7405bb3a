"""Running many synthesis jobs: concurrency, resume after interruption, dedup, cost and provenance.

An output directory holds one run::

    OUT/run.json        {"kind", "provenance"}: written once; a later run of another kind is refused
    OUT/results.jsonl   one line per finished job: key, status, kept task ids, drops, usage, cost
    OUT/tasks.jsonl     the kept tasks (``dsv32.envs`` task rows), info.job naming their job
    OUT/<artifacts>/    per-task directories (general-tool bundles), moved in from OUT/staging/
    OUT/summary.json    totals: jobs, kept, duplicates, drops by reason, tokens, cost per kept task

Jobs run on a thread pool (``workers``): synthesis spends its time waiting on endpoints and on
sandboxed subprocesses, so threads give the concurrency without pickling backends. A job's result is
committed under one lock: its artifacts move out of staging, its tasks are appended to
``tasks.jsonl``, then its line is appended to ``results.jsonl`` — that line is the commit. On resume
the jobs with a ``results.jsonl`` line are skipped (errored jobs are retried), a torn last line is cut
off, and tasks or artifacts of uncommitted jobs are removed, so an interrupted run continues as if it
had stopped between two jobs.

Dedup (:func:`dsv32.synth.records.dedup_key`) runs at commit against every task kept so far, this
run's and the resumed ones'.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from dsv32.errors import DSV32Error
from dsv32.jsonl import read_log
from dsv32.synth.records import RoleUsage, SynthError, TokenUsage, dedup_key

log = logging.getLogger(__name__)


@dataclass
class Item:
    """One task a job produced: its ``dsv32.envs`` row, the text and tool signature it is deduplicated
    on, and optionally a directory to keep with it (moved to ``OUT/<artifacts>/<task id>``, and
    ``info[artifact_field]`` set to its absolute path)."""

    task: dict
    text: str
    signature: str = ""
    artifact: Path | None = None


@dataclass
class JobResult:
    key: str
    items: list[Item] = field(default_factory=list)
    usage: RoleUsage = field(default_factory=RoleUsage)
    dropped: list[dict] = field(default_factory=list)
    stats: dict = field(default_factory=dict)


def _append(path: Path, row: dict) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(row, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


_NOT_A_LOG = "this file is not a synthesis log"


class Store:
    """The output directory of one run (see the module docstring)."""

    def __init__(self, out: str | Path, kind: str, provenance: dict, artifacts: str = "bundles",
                 artifact_field: str = "bundle") -> None:  # fmt: skip
        self.out = Path(out).resolve()
        self.kind, self.provenance = kind, provenance
        self.artifacts, self.artifact_field = self.out / artifacts, artifact_field
        self.lock = threading.Lock()
        run_file = self.out / "run.json"
        if run_file.is_file():
            previous = json.loads(run_file.read_text(encoding="utf-8"))
            if previous.get("kind") != kind:
                raise SynthError(
                    f"{self.out} holds a '{previous.get('kind')}' run, not '{kind}'; use another --out"
                )
        self.out.mkdir(parents=True, exist_ok=True)
        if not run_file.is_file():
            run_file.write_text(
                json.dumps({"kind": kind, "provenance": provenance}, indent=1), encoding="utf-8"
            )
        self.results = read_log(self.out / "results.jsonl", SynthError, _NOT_A_LOG)
        tasks = self._drop_uncommitted({r["key"] for r in self.results})
        self.seen = {t["info"]["dedup"] for t in tasks}
        shutil.rmtree(self.out / "staging", ignore_errors=True)

    def _drop_uncommitted(self, committed: set[str]) -> list[dict]:
        """Remove the tasks (and their artifacts) of jobs without a results line; the tasks left."""
        rows = read_log(self.out / "tasks.jsonl", SynthError, _NOT_A_LOG)
        keep = [t for t in rows if t["info"].get("job") in committed]
        for task in rows:
            if task["info"].get("job") not in committed and task["info"].get(self.artifact_field):
                shutil.rmtree(task["info"][self.artifact_field], ignore_errors=True)
        if len(keep) != len(rows):
            tmp = self.out / "tasks.jsonl.tmp"
            tmp.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in keep), encoding="utf-8")
            tmp.replace(self.out / "tasks.jsonl")
        return keep

    def done(self) -> set[str]:
        """Keys of the jobs already committed (errored ones excluded: they run again)."""
        return {r["key"] for r in self.results if r["status"] != "error"}

    def staging(self, key: str) -> Path:
        path = self.out / "staging" / key
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def record(self, result: JobResult) -> dict:
        """Commit one job: dedup its items, keep the new ones, log the job (one line)."""
        with self.lock:
            kept, duplicates = [], []
            new: dict[str, Item] = {}
            for item in result.items:
                key = dedup_key(item.text, item.signature)
                if key in self.seen or key in new:
                    duplicates.append(item.task["id"])
                    continue
                new[key] = item
            cost = result.usage.cost()
            per_task = cost / len(new) if new else None
            for key, item in new.items():
                task = json.loads(json.dumps(item.task))
                info = task.setdefault("info", {})
                if item.artifact is not None:
                    dest = self.artifacts / task["id"]
                    shutil.rmtree(dest, ignore_errors=True)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.move(str(item.artifact), dest)
                    info[self.artifact_field] = str(dest)
                info.update(
                    job=result.key, dedup=key, env_signature=item.signature, provenance=self.provenance
                )
                info["cost_usd"] = None if per_task is None else round(per_task, 8)
                _append(self.out / "tasks.jsonl", task)
                self.seen.add(key)
                kept.append(task["id"])
            row = {
                "key": result.key,
                "status": "kept" if kept else "dropped",
                "kept": kept,
                "duplicates": duplicates,
                "dropped": result.dropped,
                "usage": result.usage.to_dict(),
                "cost_per_kept_usd": None if per_task is None else round(per_task, 8),
                "stats": result.stats,
            }
            _append(self.out / "results.jsonl", row)
            self.results.append(row)
            shutil.rmtree(self.out / "staging" / result.key, ignore_errors=True)
            return row

    def record_error(self, key: str, message: str) -> dict:
        with self.lock:
            row = {
                "key": key,
                "status": "error",
                "error": message,
                "kept": [],
                "duplicates": [],
                "dropped": [],
            }
            _append(self.out / "results.jsonl", row)
            self.results.append(row)
            shutil.rmtree(self.out / "staging" / key, ignore_errors=True)
            return row

    def summary(self) -> dict:
        """Totals over every committed job of this directory (resumed runs included)."""
        last = {r["key"]: r for r in self.results}  # a retried job's latest line counts
        rows = list(last.values())
        usage, cost = TokenUsage(), 0.0
        reasons: Counter = Counter()
        for r in rows:
            for role in (r.get("usage") or {}).get("roles", {}).values():
                usage.add(
                    role["prompt_tokens"], role["completion_tokens"], role["cached_tokens"], role["calls"]
                )
            cost += (r.get("usage") or {}).get("cost_usd", 0.0)
            reasons.update(d.get("reason", "unknown") for d in r["dropped"])
        kept = sum(len(r["kept"]) for r in rows)
        tasks = read_log(self.out / "tasks.jsonl", SynthError, _NOT_A_LOG)
        return {
            "kind": self.kind,
            "jobs": len(rows),
            "jobs_with_errors": sum(r["status"] == "error" for r in rows),
            "kept": kept,
            "environments": len(
                {t["info"].get("env_signature") for t in tasks if t["info"].get("env_signature")}
            ),
            "duplicates": sum(len(r["duplicates"]) for r in rows),
            "dropped": dict(reasons.most_common()),
            "tokens": usage.__dict__,
            "cost_usd": round(cost, 6),
            "cost_per_kept_usd": round(cost / kept, 6) if kept else None,
            "provenance": self.provenance,
        }


def run_jobs(
    keys: Iterable[str],
    work: Callable[[str, Store], JobResult],
    store: Store,
    *,
    workers: int = 1,
    on_result: Callable[[dict], None] | None = None,
) -> dict:
    """Run ``work(key, store)`` for every key not yet done, ``workers`` at a time; commit each result
    as it finishes; write and return the summary. A job raising a :class:`DSV32Error` is logged as an
    error (run again on resume); any other exception is a bug and stops the run."""
    if workers < 1:
        raise SynthError(f"workers must be at least 1, got {workers}")
    done = store.done()
    pending = [k for k in dict.fromkeys(keys) if k not in done]
    if len(done):
        log.info("resuming: %d job(s) done, %d to run", len(done), len(pending))

    def one(key: str) -> dict:
        try:
            return store.record(work(key, store))
        except DSV32Error as err:
            log.warning("job %s failed: %s", key, err)
            return store.record_error(key, str(err))

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="synth") as pool:
        futures = [pool.submit(one, key) for key in pending]
        try:
            for future in as_completed(futures):
                row = future.result()
                if on_result is not None:
                    on_result(row)
        except BaseException:
            for f in futures:
                f.cancel()
            raise
    with contextlib.suppress(OSError):  # empty once every job committed
        (store.out / "staging").rmdir()
    summary = store.summary()
    (store.out / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    return summary
