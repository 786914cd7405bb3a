"""Running many synthesis jobs: concurrency, resume after interruption, dedup, cost and provenance.

An output directory holds one run::

    OUT/.lock           held (``fcntl.flock``, without waiting) by the one run using the directory
    OUT/run.json        {"kind", "provenance"}: written once; a later run of another kind, other
                        generators or other settings is refused
    OUT/results.jsonl   one line per finished job: key, status, kept task ids, drops, usage, cost
    OUT/tasks.jsonl     the kept tasks (``dsv32.envs`` task rows), info.job naming their job
    OUT/<artifacts>/    per-task directories (general-tool bundles), moved in from OUT/staging/
    OUT/summary.json    totals: jobs, kept, duplicates, drops by reason, tokens, cost per kept task

Jobs run on a thread pool (``workers``): synthesis spends its time waiting on endpoints and on
sandboxed subprocesses, so threads give the concurrency without pickling backends. A job's result is
committed under one lock: its artifacts move out of staging, its tasks are appended to
``tasks.jsonl``, then its line is appended to ``results.jsonl`` — that line is the commit. On resume
the jobs with a ``results.jsonl`` line are skipped (errored jobs are retried), a torn last line is cut
off, and tasks or artifacts of uncommitted jobs (errored ones included) are removed, so an
interrupted run continues as if it had stopped between two jobs. Nothing is written before the directory is known to be this run's
(:class:`Store`), and nothing outside ``OUT/<artifacts>/`` and ``OUT/staging/`` is ever deleted. A
second run on a directory in use stops at once with a :class:`SynthError` and changes nothing, since
its resume would delete the staged and uncommitted work of the first.

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
from typing import IO

from dsv32.errors import DSV32Error
from dsv32.jsonl import peek_log, read_json, read_log
from dsv32.paths import lock_directory
from dsv32.runlog import write_text
from dsv32.synth.records import JobFailed, RoleUsage, SynthError, TokenUsage, dedup_key

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

#: The files and directories every run writes in its output directory (besides ``run.json`` and the
#: artifacts directory): a directory that holds any of them without a ``run.json`` is refused.
OWNED = ("results.jsonl", "tasks.jsonl", "summary.json", "staging")
_STATUSES = ("kept", "dropped", "error")


def _result_problem(row: object) -> str | None:
    """What makes ``row`` not a ``results.jsonl`` row of this package, or None."""
    if not isinstance(row, dict):
        return f"expected a JSON object, got {type(row).__name__}"
    if not isinstance(row.get("key"), str) or not row["key"]:
        return "no job 'key'"
    if row.get("status") not in _STATUSES:
        return f"'status' is {row.get('status')!r}, not one of {', '.join(_STATUSES)}"
    for name in ("kept", "duplicates", "dropped"):
        if not isinstance(row.get(name), list):
            return f"'{name}' is not a list"
    if not all(isinstance(d, dict) for d in row["dropped"]):
        return "'dropped' holds a value that is not an object"
    for name in ("usage", "stats"):
        if not isinstance(row.get(name, {}), dict):
            return f"'{name}' is not an object"
    return None


def _task_problem(row: object) -> str | None:
    """What makes ``row`` not a ``tasks.jsonl`` row this package committed, or None."""
    if not isinstance(row, dict):
        return f"expected a JSON object, got {type(row).__name__}"
    if not isinstance(row.get("id"), str):
        return "no task 'id'"
    info = row.get("info")
    if (
        not isinstance(info, dict)
        or not isinstance(info.get("job"), str)
        or not isinstance(info.get("dedup"), str)
    ):
        return "no 'info' object with the 'job' and 'dedup' a synthesis run records"
    return None


def _safe_name(name: str) -> bool:
    """``name`` is one path component (a job key or task id used as a directory name under OUT)."""
    return bool(name) and name not in (".", "..") and not any(c in name for c in "/\\\0")


def _lock(out: Path) -> IO:
    """The open ``OUT/.lock``, locked exclusively (:func:`dsv32.paths.lock_directory`), or
    :class:`SynthError` at once if another run holds it."""
    handle = lock_directory(out)
    if handle is None:
        raise SynthError(
            f"another run is using {out} (it holds {out / '.lock'}); wait for it to end or use another --out"
        )
    return handle


def _differences(before: dict, now: dict, scope: Iterable[str]) -> list[str]:
    """``name old -> new`` for every generator and setting that differs (``scope`` settings may)."""
    changed = []
    for part in ("generators", "settings"):
        old, new = before.get(part) or {}, now.get(part) or {}
        if not isinstance(old, dict):
            old = {}
        for name in sorted(set(old) | set(new)):
            if part == "settings" and name in scope:
                continue
            if old.get(name) != new.get(name):
                changed.append(f"{name} {old.get(name)!r} -> {new.get(name)!r}")
    return changed


class Store:
    """The output directory of one run (see the module docstring).

    Opening it checks everything before writing anything: ``run.json`` must name the same kind of run
    with the same generators and settings (``scope`` names the settings that only choose which jobs
    run, e.g. a task limit, and may change between runs); ``results.jsonl`` and ``tasks.jsonl`` must
    be this package's logs; a directory without ``run.json`` must not hold any file a run writes
    (:data:`OWNED`, the artifacts directory, ``owned``). Only then is a torn last line cut off and
    are the tasks of uncommitted jobs removed — and their artifacts, if they lie in
    ``OUT/<artifacts>/``: nothing outside the output directory is ever deleted.

    The store holds ``OUT/.lock`` from opening to :meth:`close` (or the end of the process); the
    checks run again once it is held."""

    def __init__(self, out: str | Path, kind: str, provenance: dict, artifacts: str | None = "bundles",
                 artifact_field: str = "bundle", *, scope: Iterable[str] = (),
                 owned: Iterable[str] = ()) -> None:  # fmt: skip
        self.out = Path(out).resolve()
        self.kind, self.provenance = kind, provenance
        self.artifacts = None if artifacts is None else self.out / artifacts
        self.artifact_field = artifact_field
        self.lock = threading.Lock()
        self._owned = [*OWNED, *owned, *([artifacts] if artifacts else [])]
        self._scope = set(scope)
        if self.out.exists() and not self.out.is_dir():
            raise SynthError(f"--out {self.out} is a file, not a directory; use another --out")
        self._check()  # before the lock file is made: a directory that is not this run's gets nothing
        self.out.mkdir(parents=True, exist_ok=True)
        self._lock_file: IO | None = _lock(self.out)
        try:
            self._take(*self._check())  # again under the lock: another run may have ended meanwhile
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Let another run use the directory (also done when the process ends)."""
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self) -> tuple[list, int, list, int]:
        """Read-only: refuse a directory that is not this run's; its results and tasks (with the
        length of a torn last line of each)."""
        run_file = self.out / "run.json"
        if run_file.is_file():
            self._check_run_file(run_file, self._scope)
        else:
            found = [n for n in self._owned if (self.out / n).exists()]
            if found:
                raise SynthError(
                    f"{self.out} holds {', '.join(found)} but no run.json, so it is not a synthesis "
                    "run directory this command may write into; use another --out"
                )
        results, results_tail = peek_log(self.out / "results.jsonl", SynthError, _NOT_A_LOG)
        for n, row in results:
            if (why := _result_problem(row)) is not None:
                raise SynthError(
                    f"{self.out / 'results.jsonl'}:{n}: not a synthesis result ({why}); {_NOT_A_LOG}"
                )
        tasks, tasks_tail = peek_log(self.out / "tasks.jsonl", SynthError, _NOT_A_LOG)
        for n, row in tasks:
            if (why := _task_problem(row)) is not None:
                raise SynthError(
                    f"{self.out / 'tasks.jsonl'}:{n}: not a synthesized task ({why}); {_NOT_A_LOG}"
                )
        return results, results_tail, tasks, tasks_tail

    def _take(self, results: list, results_tail: int, tasks: list, tasks_tail: int) -> None:
        """Make the checked directory this run's: record it, cut torn lines, drop uncommitted jobs."""
        run_file = self.out / "run.json"
        if not run_file.is_file():
            run_file.write_text(
                json.dumps({"kind": self.kind, "provenance": self.provenance}, indent=1), encoding="utf-8"
            )
        for name, tail in (("results.jsonl", results_tail), ("tasks.jsonl", tasks_tail)):
            if tail:  # an interrupted write: cut off, so the next row starts on a line of its own
                path = self.out / name
                with path.open("r+b") as f:
                    f.truncate(path.stat().st_size - tail)
        self.results = [row for _, row in results]
        kept = self._drop_uncommitted([row for _, row in tasks], self.done())
        self.seen = {t["info"]["dedup"] for t in kept}
        shutil.rmtree(self.out / "staging", ignore_errors=True)

    def _check_run_file(self, run_file: Path, scope: set[str]) -> None:
        previous = read_json(run_file, SynthError, _NOT_A_LOG)
        if (
            not isinstance(previous, dict)
            or not isinstance(previous.get("kind"), str)
            or not isinstance(previous.get("provenance"), dict)
        ):
            raise SynthError(
                f"{run_file}: not a synthesis run record (an object with 'kind' and 'provenance'); "
                "use another --out"
            )
        if previous["kind"] != self.kind:
            raise SynthError(
                f"{self.out} holds a '{previous['kind']}' run, not '{self.kind}'; use another --out"
            )
        changed = _differences(previous["provenance"], self.provenance, scope)
        if changed:
            raise SynthError(
                f"{self.out} holds a {self.kind} run with other settings ({'; '.join(changed)}); "
                "run it with its own settings to resume it, or use another --out"
            )

    def _own_artifact(self, path: object) -> Path | None:
        """``path`` resolved, if it is a directory of this run's artifacts directory; else None."""
        if self.artifacts is None or not isinstance(path, str) or not path:
            return None
        resolved = Path(path).resolve()
        return resolved if resolved.parent == self.artifacts.resolve() else None

    def _drop_uncommitted(self, rows: list[dict], committed: set[str]) -> list[dict]:
        """Remove the tasks of jobs without a results line, and their artifacts if this run owns them
        (:meth:`_own_artifact`); the tasks left."""
        keep = [t for t in rows if t["info"]["job"] in committed]
        for task in rows:
            if task["info"]["job"] not in committed:
                artifact = self._own_artifact(task["info"].get(self.artifact_field))
                if artifact is not None:
                    shutil.rmtree(artifact, ignore_errors=True)
        if len(keep) != len(rows):
            write_text(
                self.out / "tasks.jsonl", "".join(json.dumps(t, ensure_ascii=False) + "\n" for t in keep)
            )
        return keep

    def done(self) -> set[str]:
        """Keys of the jobs already committed (errored ones excluded: they run again)."""
        return {r["key"] for r in self.results if r["status"] != "error"}

    def staging(self, key: str) -> Path:
        """A fresh directory ``OUT/staging/<key>`` for the job's artifacts before its commit."""
        if not _safe_name(key):
            raise SynthError(f"job key {key!r} cannot name a directory (it must be one path component)")
        path = self.out / "staging" / key
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def _unstage(self, key: str) -> None:
        if _safe_name(key):
            shutil.rmtree(self.out / "staging" / key, ignore_errors=True)

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
            for item in new.values():  # checked before anything of the job is committed
                if item.artifact is not None and (self.artifacts is None or not _safe_name(item.task["id"])):
                    raise SynthError(
                        f"task {item.task['id']!r}: its artifact cannot be kept (a task id with an artifact "
                        "must be one path component, in a run that keeps artifacts)"
                    )
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
            self._unstage(result.key)
            return row

    def record_error(self, key: str, message: str, usage: RoleUsage | None = None) -> dict:
        """Log a failed job: it commits nothing and runs again; ``usage`` is what it spent."""
        with self.lock:
            row = {
                "key": key,
                "status": "error",
                "error": message,
                "kept": [],
                "duplicates": [],
                "dropped": [],
                "usage": (usage or RoleUsage()).to_dict(),
            }
            _append(self.out / "results.jsonl", row)
            self.results.append(row)
            self._unstage(key)
            return row

    def summary(self) -> dict:
        """Totals over every committed job of this directory (resumed runs included)."""
        last = {r["key"]: r for r in self.results}  # a retried job's latest line counts
        rows = list(last.values())
        usage, cost = TokenUsage(), 0.0
        for r in self.results:  # every attempt was paid for, failed ones included
            for role in (r.get("usage") or {}).get("roles", {}).values():
                usage.add(
                    role["prompt_tokens"], role["completion_tokens"], role["cached_tokens"], role["calls"]
                )
            cost += (r.get("usage") or {}).get("cost_usd", 0.0)
        reasons: Counter = Counter()
        for r in rows:
            reasons.update(d.get("reason", "unknown") for d in r["dropped"])
        kept = sum(len(r["kept"]) for r in rows)
        tasks = read_log(self.out / "tasks.jsonl", SynthError, _NOT_A_LOG)
        return {
            "kind": self.kind,
            "jobs": len(rows),
            "jobs_with_errors": sum(r["status"] == "error" for r in rows),
            "first_error": next(
                (f"{r['key']}: {r.get('error')}" for r in rows if r["status"] == "error"), None
            ),
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
            return store.record_error(key, str(err), err.usage if isinstance(err, JobFailed) else None)

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
