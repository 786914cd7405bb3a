"""Mining SWE-style tasks from a released package: its own test suite, injected bugs, kept mutants.

``build_swe_tasks("inflection==0.5.1", n=50, out=...)``:

1. download and unpack the sdist (:mod:`~dsv32.envs.swe.snapshot`), copy it to a work dir;
2. run the suite once in the sandbox with :mod:`~dsv32.envs.swe.calltrace`: the passing tests and
   the functions they call;
3. list every mutant (:mod:`~dsv32.envs.swe.mutate`) of the called functions in the package's
   source files (tests, docs, ``setup.py`` and version files excluded), shuffle each operator's
   list with ``seed`` and interleave the operators, so the kept tasks mix operators;
4. run the suite on each mutant in turn; keep it when 1 to ``max_failing`` of the passing tests fail
   and at most ``per_function`` tasks come from one function; stop at ``n`` kept or ``max_tries``;
5. write each as a task: ``FAIL_TO_PASS`` (the tests the bug breaks), ``PASS_TO_PASS`` (the other
   tests that passed), the bug as an exact-string edit, the fix as a unified diff (``patch``), and
   an issue text from the failing tests' messages.
"""

from __future__ import annotations

import json
import logging
import random
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from dsv32.envs.base import EnvError, Task, save_tasks
from dsv32.envs.swe import calltrace
from dsv32.envs.swe.issue import issue_text
from dsv32.envs.swe.mutate import OPERATORS, Mutant, mutants
from dsv32.envs.swe.snapshot import materialize, parse_spec, python_path, unified_diff
from dsv32.envs.swe.testrun import TestReport, run_pytest

log = logging.getLogger(__name__)

_NOT_SOURCE_DIRS = {"tests", "test", "testing", "docs", "doc", "examples", "benchmarks", "bench"}
_NOT_SOURCE_FILES = {"setup.py", "conftest.py", "versioneer.py", "_version.py", "version.py", "noxfile.py"}


def is_source(rel: str) -> bool:
    """A library source file (not a test, doc, build or version file)."""
    parts = rel.split("/")
    name = parts[-1]
    return (
        name.endswith(".py")
        and not set(parts[:-1]) & _NOT_SOURCE_DIRS
        and name not in _NOT_SOURCE_FILES
        and not name.startswith("test_")
        and not name.endswith("_test.py")
    )


def baseline(repo: Path, pythonpath: str, scratch: Path) -> tuple[TestReport, dict[str, set[int]]]:
    """The suite's report on the unmodified repo and, per source file, the first lines of the
    functions the tests called."""
    trace = scratch / "calls.json"
    report = run_pytest(
        repo, pythonpath=pythonpath, plugins=[Path(calltrace.__file__)], writable=[str(scratch)],
        env={"DSV32_TRACE_ROOT": str(repo.resolve()), "DSV32_TRACE_OUT": str(trace)},
    )  # fmt: skip
    covered: dict[str, set[int]] = defaultdict(set)
    if trace.is_file():
        for rel, line in json.loads(trace.read_text()):
            if is_source(rel):
                covered[rel].add(line)
    return report, covered


def candidates(repo: Path, covered: dict[str, set[int]], seed: int) -> list[Mutant]:
    """Every mutant of the called functions, operators interleaved, each operator's list shuffled."""
    by_op: dict[str, list[Mutant]] = defaultdict(list)
    for rel in sorted(covered):
        for m in mutants(rel, (repo / rel).read_text(encoding="utf-8"), covered[rel]):
            by_op[m.op].append(m)
    rng = random.Random(seed)
    for op in OPERATORS:
        rng.shuffle(by_op[op])
    order: list[Mutant] = []
    for i in range(max((len(v) for v in by_op.values()), default=0)):
        order += [by_op[op][i] for op in OPERATORS if i < len(by_op[op])]
    return order


def _task(spec: str, m: Mutant, failing: list[str], passing: list[str], report: TestReport, total: int, k: int,
          pythonpath: str, bugged: str, fixed: str) -> Task:  # fmt: skip
    name, version = parse_spec(spec)
    info = {
        "package": spec,
        "bug": [m.edit.to_dict()],
        "patch": unified_diff(m.edit.path, bugged, fixed),
        "FAIL_TO_PASS": failing,
        "PASS_TO_PASS": passing,
        "pythonpath": pythonpath,
        "mutation": {"op": m.op, "function": m.function, "path": m.edit.path, "line": m.line},
    }
    prompt = issue_text(name, version, failing, report.messages, total)
    return Task(f"{name}-{version}-{k:03d}", prompt, None, "swe", info)


def mine(
    spec: str,
    n: int,
    seed: int = 0,
    *,
    max_failing: int = 20,
    per_function: int = 2,
    max_tries: int | None = None,
) -> list[Task]:
    """Up to ``n`` tasks mined from ``spec`` (see the module docstring); fewer when the candidates
    or ``max_tries`` (default ``8 * n``) run out."""
    if n < 1:
        raise EnvError(f"--n must be at least 1, got {n}")
    tries = max_tries or 8 * n
    with tempfile.TemporaryDirectory(prefix="dsv32-mine-") as tmp:
        repo = materialize(spec, [], Path(tmp) / "repo")
        scratch = Path(tmp) / "scratch"
        scratch.mkdir()
        pp = python_path(repo)
        start = time.perf_counter()
        base, covered = baseline(repo, pp, scratch)
        base_s = time.perf_counter() - start
        passing = sorted(t for t, o in base.outcomes.items() if o == "passed")
        if not passing:
            raise EnvError(f"{spec}: no test passes on the released source; output:\n{base.output[-1500:]}")
        order = candidates(repo, covered, seed)
        log.info("%s: %d passing tests, %d candidate mutants", spec, len(passing), len(order))
        tasks: list[Task] = []
        per_fn: dict[str, int] = defaultdict(int)
        runs = 0
        for m in order:
            if len(tasks) >= n or runs >= tries:
                break
            key = f"{m.edit.path}:{m.function}"
            if per_fn[key] >= per_function:
                continue
            runs += 1
            path = repo / m.edit.path
            fixed = path.read_text(encoding="utf-8")
            bugged = fixed.replace(m.edit.old, m.edit.new, 1)
            path.write_text(bugged, encoding="utf-8")
            try:
                report = run_pytest(repo, pythonpath=pp, timeout_s=max(60.0, 5 * base_s))
            finally:
                path.write_text(fixed, encoding="utf-8")
            failing = [t for t in passing if not report.passed(t)]
            if not report.outcomes or not 1 <= len(failing) <= max_failing:
                continue
            still = [t for t in passing if report.passed(t)]
            tasks.append(_task(spec, m, failing, still, report, len(passing), len(tasks), pp, bugged, fixed))
            per_fn[key] += 1
            log.info("%s: kept %s %s (%d failing)", spec, m.op, m.function, len(failing))
    return tasks


def build_swe_tasks(spec: str, n: int, out: Path, seed: int = 0) -> Path:
    """Mine up to ``n`` tasks from ``spec`` (``NAME==VERSION``) and write them to ``out``: a
    ``.jsonl`` path, or a folder (then ``out/NAME-VERSION.jsonl``). Returns the file written."""
    name, version = parse_spec(spec)
    out = Path(out)
    path = out if out.suffix == ".jsonl" else out / f"{name}-{version}.jsonl"
    tasks = mine(spec, n, seed)
    if not tasks:
        raise EnvError(f"{spec}: no mutant made 1 to 20 tests fail; try another package or version")
    return save_tasks(tasks, path)
