"""Running a repository's tests in the sandbox, reading pytest's JUnit XML report and the seal's
verdicts.

Outcomes come from the report (``--junitxml``, ``junit_family=xunit1`` so each ``testcase`` carries
its ``file``), never from the console. Each test case becomes its pytest node id
(``tests/test_lru.py::LRUCacheTest::test_lru``, ``test_inflection.py::test_camelize[a-A]``) and an
outcome, the worse of its phases: ``error`` > ``failed`` > ``skipped`` > ``passed`` (a test whose
call failed and whose teardown errored is an error). A test missing from the report (a collection
error, a crash) did not pass, and neither does one the seal (:mod:`~dsv32.envs.swe.seal`) did not
vouch for: its verdicts are MAC-chained with a key the run reads from its stdin, and they count only
when the chain is whole and ends with pytest intact (:func:`read_verdicts`).

pytest starts so that nothing in the repository can stand in for it: ``python -P -s`` (neither the
working directory nor the user's site-packages on ``sys.path``, no ``PYTHONPATH``) imports pytest,
its built-in plugins, ``unittest`` and the seal first, and only then puts the repository on
``sys.path``, after the standard library (a ``pytest.py``, ``sitecustomize.py``, ``_pytest/`` or
``unittest.py`` there is never imported in place of the real one); the repository is read-only to
the run; the process ends with ``os._exit`` right after pytest returns, so the tested code's exit
hooks never run. The host reads the report and the verdicts only from regular files (not a
symlink, FIFO or directory) of at most :data:`REPORT_BYTES`, the report well-formed without a
DOCTYPE; otherwise the run has no results.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import shutil
import stat
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from dsv32.envs import sandbox
from dsv32.envs.base import EnvError
from dsv32.envs.swe.snapshot import SnapshotError, read_regular

_RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
MESSAGE_CHARS = 400
REPORT_BYTES = 32 << 20  # the largest JUnit report read
_MODULE_DEPTH = 32  # the most dotted parts of a classname tried as a module path
UNVOUCHED = (
    "not vouched for by the test harness: its body did not run to its end under an intact pytest, or it "
    "is not the test its file defines"
)

# pytest's launcher, run as ``python -P -s -c _BOOT PLUGINS REPO PYTHONPATH ARGS...``: pytest, its
# built-in plugins and the seal load before anything of the repository can be imported; the
# repository's folders go on sys.path after the standard library (a repository module cannot stand
# in for one) and before the installed packages (the package under test is the repository's)
_BOOT = """\
import importlib, os, site, sys, unittest
import pytest
from _pytest.config import default_plugins
for name in default_plugins:
    importlib.import_module("_pytest." + name)
plugins, repo, package = sys.argv[1:4]
del sys.argv[1:4]
sys.path.insert(0, plugins)
import _dsv32_seal
installed = {os.path.realpath(p) for p in site.getsitepackages()}
at = next((i for i, p in enumerate(sys.path) if os.path.realpath(p) in installed), len(sys.path))
sys.path[at:at] = list(dict.fromkeys([repo, package]))
os.environ["PYTHONPATH"] = package
os.chdir(repo)
code = pytest.main(sys.argv[1:])
sys.stdout.flush()
sys.stderr.flush()
os._exit(int(code))
"""
SEAL = Path(__file__).with_name("seal.py")


@dataclass
class TestReport:
    """Per-test outcomes and failure messages of one pytest run, and how the run ended."""

    outcomes: dict[str, str] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)
    returncode: int = 0
    timed_out: bool = False
    output: str = ""
    harness: str = ""  # why the seal vouched for no test ('' when its verdicts were read)

    __test__ = False  # not a pytest test class

    def passed(self, test_id: str) -> bool:
        return self.outcomes.get(test_id) == "passed"

    def failing(self) -> list[str]:
        return [t for t, o in self.outcomes.items() if o in ("failed", "error")]


def _is(path: Path, kind) -> bool:
    """Whether ``path`` is of ``kind`` (``stat.S_ISREG``, ...); False when it cannot be looked up
    (missing, a name too long, a symlink loop)."""
    try:
        return kind(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def node_id(
    classname: str, name: str, file: str | None, root: Path | None = None, seen: dict | None = None
) -> str:
    """A JUnit test case's pytest node id: the test module named by the longest prefix of
    ``classname`` that is a ``.py`` file under ``root`` (else the case's ``file``), then the classes
    left in ``classname``, then the name. ``classname`` comes first because a test inherited from a
    mixin has the mixin's file in ``file`` but the collecting module in ``classname``. ``seen``
    keeps the file checks for the next case of the same report (at most one check per existing
    folder level and :data:`_MODULE_DEPTH` parts, so a forged report cannot make it slow)."""
    parts = classname.split(".") if classname else []
    module_file = None
    if root is not None:
        seen = {} if seen is None else seen  # stem -> (stem.py is a file, stem is a folder)
        for i in range(1, min(len(parts), _MODULE_DEPTH) + 1):
            stem = "/".join(parts[:i])
            if stem not in seen:
                seen[stem] = (_is(root / (stem + ".py"), stat.S_ISREG), _is(root / stem, stat.S_ISDIR))
            is_file, is_dir = seen[stem]
            if is_file:
                module_file = stem + ".py"
            if not is_dir:
                break
    module_file = module_file or (file or "").replace(os.sep, "/") or None
    if not module_file:
        return "::".join(p for p in (classname, name) if p)
    module = module_file.removesuffix(".py").replace("/", ".")
    rest = classname[len(module) + 1 :] if classname.startswith(module + ".") else ""
    return "::".join([module_file, *(rest.split(".") if rest else []), name])


def parse_junit(xml: str | bytes, root: Path | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """``(outcomes, messages)`` by node id from a JUnit XML report; ``xml.etree.ElementTree.ParseError``
    when it is malformed or has a DOCTYPE (pytest writes none; entities could make it huge)."""
    if ("<!DOCTYPE" if isinstance(xml, str) else b"<!DOCTYPE") in xml:
        raise ET.ParseError("a DOCTYPE in a JUnit report (pytest writes none)")
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    seen: dict = {}
    for case in ET.fromstring(xml).iter("testcase"):
        tid = node_id(case.get("classname", ""), case.get("name", ""), case.get("file"), root, seen)
        outcome, message = "passed", ""
        for child in case:
            kind = {"failure": "failed", "error": "error", "skipped": "skipped"}.get(child.tag)
            if kind and _RANK[kind] > _RANK[outcome]:
                outcome = kind
                message = (child.get("message") or (child.text or "")).strip()
        if _RANK[outcome] >= _RANK.get(outcomes.get(tid, "passed"), 0):
            outcomes[tid] = outcome
            if message and outcome in ("failed", "error"):
                messages[tid] = message[:MESSAGE_CHARS]
    return outcomes, messages


def check_pythonpath(pythonpath: object) -> str:
    """``pythonpath`` if it names a folder inside the repository: a relative path without ``..``
    parts or a NUL byte (``.``, ``src``, ``lib/python``); else an :class:`EnvError` (the folder is
    bound into the sandbox, so one outside the repository would show the program what it hides)."""
    if (
        not isinstance(pythonpath, str)
        or not pythonpath
        or "\0" in pythonpath
        or os.path.isabs(pythonpath)
        or ".." in Path(pythonpath).parts
    ):
        raise EnvError(
            f"pythonpath {pythonpath!r} must be a relative folder inside the repository ('.' or 'src'), "
            "without '..'"
        )
    return pythonpath


def test_env(repo: Path, pythonpath: str, scratch: Path) -> dict[str, str]:
    """The environment of a sandboxed command in ``repo``: this Python's ``bin`` first on ``PATH``
    (``python`` and ``pytest`` are the project's), the package importable (``pythonpath``, checked
    by :func:`check_pythonpath`), temp files in ``scratch``, no pytest plugins loaded by entry point.
    A :class:`SnapshotError` when that folder resolves outside the repository (a symlink the
    repository's commands made)."""
    package = (repo / check_pythonpath(pythonpath)).resolve()
    if not package.is_relative_to(repo.resolve()):
        raise SnapshotError(f"the package folder {pythonpath!r} leads outside the repository (a symlink)")
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)])
    return {
        "PATH": path,
        "PYTHONPATH": str(package),
        "TMPDIR": str(scratch),
        "PYTHONHASHSEED": "0",
        # the repository's conftest.py still loads; the plugins installed in this venv (hypothesis,
        # anyio, ...) do not, so a run does not depend on what else the project's venv holds
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }


def read_verdicts(text: str, key: bytes) -> tuple[set[str], str]:
    """``(node ids the seal vouches for, problem)`` from the seal's verdict file (see
    :mod:`~dsv32.envs.swe.seal`): the tests whose line says ``ok`` when every line's MAC checks out
    in order and the last is an ``end`` line reporting pytest intact; else no test and why not."""
    mac, last, vouched = hmac.new(key, digestmod=hashlib.sha256), "", set()
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    for n, line in enumerate(lines, 1):
        body, _, tag = line.rpartition("\t")
        step = mac.copy()
        step.update(f"{last}\n{body}".encode())
        try:
            seq, first, verdict, why = json.loads(body)
        except (ValueError, TypeError):
            seq = None
        if seq != n or not hmac.compare_digest(step.hexdigest(), tag):
            return set(), "the test harness's verdicts were tampered with"
        last = tag
        if first == "end" and n == len(lines):
            return (vouched, "") if verdict == "intact" else (set(), f"pytest was tampered with: {why}")
        if verdict == "ok":
            vouched.add(first)
    return set(), "the test run did not finish (no closing verdict from the test harness)"


def run_pytest(
    repo: Path,
    *,
    pythonpath: str = ".",
    args: list[str] | None = None,
    timeout_s: float = 300,
    memory_mb: int = 4096,
    extra: list[str] | None = None,
    env: dict[str, str] | None = None,
    writable: list[str] | None = None,
    plugins: list[Path] | None = None,
) -> TestReport:
    """Run pytest on ``args`` (node ids or paths; default: the suite) in ``repo``, sandboxed (no
    network; ``repo`` read-only, a scratch dir and ``writable`` writable), and read its JUnit report
    and the seal's verdicts (:mod:`~dsv32.envs.swe.seal`): a test passes only when both say so.
    ``extra`` goes before ``args`` on pytest's command line, ``env`` into its environment (the
    package's folder ``pythonpath`` goes on ``sys.path`` once pytest is imported, and into
    ``PYTHONPATH`` for the programs the tests start). ``plugins`` are pytest plugins as standalone
    module files: each is copied (as ``_dsv32_NAME.py``), with the seal, into a read-only folder
    outside the repository that goes first on ``sys.path`` (nothing in the repository can stand in
    for them), and loaded with ``-p`` (so the sandbox needs nothing of this project's source, which
    it hides). A report that cannot be read gives no results, with the reason at the end of
    ``output``."""
    base = Path(tempfile.mkdtemp(prefix="dsv32-pytest-"))
    try:
        scratch, plugin_dir = base / "scratch", base / "plugins"
        scratch.mkdir()
        plugin_dir.mkdir()
        report, verdicts, key = scratch / "report.xml", scratch / "verdicts", secrets.token_bytes(32)
        full_env = {**test_env(repo, pythonpath, scratch), **(env or {}), "DSV32_SEAL_OUT": str(verdicts)}
        path = full_env.pop("PYTHONPATH")
        loads = ["-p", "_dsv32_seal"]
        shutil.copyfile(SEAL, plugin_dir / "_dsv32_seal.py")
        for plugin in plugins or []:
            shutil.copyfile(plugin, plugin_dir / f"_dsv32_{plugin.name}")
            loads += ["-p", f"_dsv32_{plugin.stem}"]
        argv = [sys.executable, "-P", "-s", "-c", _BOOT, str(plugin_dir), str(repo.resolve()), path,
                "-q", "-p", "no:cacheprovider", *loads,
                "-o", "junit_family=xunit1", f"--junitxml={report}", f"--rootdir={repo.resolve()}",
                *(extra or []), *(args or [])]  # fmt: skip
        done = sandbox.run(
            argv, cwd=scratch, stdin=key.hex() + "\n", timeout_s=timeout_s, memory_mb=memory_mb,
            env=full_env, writable=[*(writable or [])], readable=[str(repo), str(plugin_dir)],
            output_bytes=1 << 18,
        )  # fmt: skip
        tail = (done.stdout + done.stderr)[-4000:]
        outcomes: dict[str, str] = {}
        messages: dict[str, str] = {}
        if os.path.lexists(report):
            try:
                outcomes, messages = parse_junit(read_regular(report, "the JUnit report", REPORT_BYTES), repo)
            except (SnapshotError, OSError, ET.ParseError) as err:
                tail += f"\n[the JUnit report was not read: {err}]"
        vouched, problem = set(), "the test harness wrote no verdicts"
        if os.path.lexists(verdicts):
            try:
                text = read_regular(verdicts, "the verdict file", REPORT_BYTES).decode("utf-8")
                vouched, problem = read_verdicts(text, key)
            except (SnapshotError, OSError, UnicodeDecodeError) as err:
                problem = f"the verdict file was not read: {err}"
        for tid, outcome in outcomes.items():
            if outcome == "passed" and tid not in vouched:
                outcomes[tid] = "failed"
                messages[tid] = (problem or UNVOUCHED)[:MESSAGE_CHARS]
        if problem and outcomes:
            tail += f"\n[{problem}]"
    finally:
        sandbox.remove_tree(base)
    return TestReport(outcomes, messages, done.returncode, done.timed_out, tail, problem)


def summarize(report: TestReport, limit: int = 20) -> str:
    """A short text for the model: counts, then the failing tests with their messages."""
    counts: dict[str, int] = {}
    for outcome in report.outcomes.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    if not report.outcomes:
        head = "no test results (pytest crashed or collected nothing)"
        if report.timed_out:
            head = "the test run timed out"
        return f"{head}; exit code {report.returncode}\n{report.output}"
    head = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + (
        " (timed out)" if report.timed_out else ""
    )
    lines = [head]
    failing = report.failing()
    for tid in failing[:limit]:
        msg = report.messages.get(tid, "").splitlines()
        lines.append(f"FAILED {tid}" + (f": {' | '.join(msg[:3])}" if msg else ""))
    if len(failing) > limit:
        lines.append(f"... and {len(failing) - limit} more failing tests")
    return "\n".join(lines)
