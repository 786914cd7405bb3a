"""Checking one version of a synthesized task, as the synthesizing agent submits it (paper §3.2.3).

A version is the agent's workspace at the time it calls ``submit_version(prompt)``::

    db.sqlite     the environment's data (at least one table with rows)
    tools.py      the task's tools: def NAME(db, arg: type, ...) with a docstring
    solution.py   def solve(tools) -> str   — may only call tools.NAME(...) and compute
    verify.py     def verify(initial_db, final_db, answer) -> bool   (assert cond, "why" allowed)

The four files must be regular files: a symbolic link is refused and never followed (the host copies
them, and a link made in the sandbox could name a host file the sandbox hides). It is accepted when,
on a frozen copy of those files, in the sandbox:

1. the tool schemas can be read off ``tools.py`` (:mod:`.harness` ``schema``);
2. ``solution.py`` passes the static rules (:func:`solution_problems`: imports only from
   :data:`SOLUTION_IMPORTS`, no file, eval or import builtins, no ``_private`` attributes — so it can
   reach the data only through the tools);
3. ``solve(tools)`` runs, calls at least one tool, returns a string, and
   ``verify(initial, final, answer)`` accepts its result (else the agent repairs and resubmits);
4. ``verify`` rejects an episode that did nothing: no calls, the database untouched, and each answer
   of :data:`IDLE_ANSWERS` (nothing, and a non-empty non-answer);
5. for version ``n > 1`` (escalation): the prompt differs from version ``n − 1``, the tools keep
   version ``n − 1``'s names and parameters (:func:`tool_changes`: tools and optional parameters
   may be added), and the previous version's ``solve`` does not pass the new verifier on the new
   database and tools — a harder version is one the easier solution no longer solves, not one it
   can no longer call.

The recorded tool calls of ``solve`` and its answer become the bundle's reference solution.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import sqlite3
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dsv32.envs import sandbox
from dsv32.envs.general.env import RUNNER
from dsv32.synth.records import SynthError, normalize

HARNESS = str(Path(__file__).with_name("harness.py"))
VERSION_FILES = ("db.sqlite", "tools.py", "solution.py", "verify.py")
#: The answers of an episode that did nothing: ``verify`` must reject each on the untouched database
#: (a verifier that only checks that some answer was given accepts the second).
IDLE_ANSWERS = ("", "I could not complete the task.")
SOLUTION_IMPORTS = frozenset(
    [
        "bisect",
        "collections",
        "copy",
        "dataclasses",
        "datetime",
        "decimal",
        "fractions",
        "functools",
        "heapq",
        "itertools",
        "json",
        "math",
        "operator",
        "re",
        "statistics",
        "string",
        "typing",
    ]
)
FORBIDDEN_CALLS = frozenset(
    [
        "open",
        "exec",
        "eval",
        "compile",
        "__import__",
        "globals",
        "locals",
        "vars",
        "getattr",
        "setattr",
        "delattr",
        "input",
        "breakpoint",
    ]
)


@dataclass
class Limits:
    """Sandbox limits of each check (one process per harness step)."""

    timeout_s: float = 30.0
    memory_mb: int = 1024
    isolation: str | None = None


@dataclass
class Version:
    """An accepted version: its frozen files in ``path`` and what checking it produced."""

    index: int
    prompt: str
    path: Path
    tools: list[dict]
    calls: list[dict]
    answer: str
    harder: str = ""


@dataclass
class Verdict:
    accepted: bool
    reason: str
    version: Version | None = None


def solution_problems(source: str) -> list[str]:
    """What breaks the solution's rules (empty when it follows them)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        return [f"solution.py does not parse: {err.msg} (line {err.lineno})"]
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for name in names:
                if name.split(".")[0] not in SOLUTION_IMPORTS:
                    problems.append(
                        f"line {node.lineno}: import of {name!r} (allowed: {', '.join(sorted(SOLUTION_IMPORTS))})"
                    )
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_CALLS:
            problems.append(f"line {node.lineno}: {node.id} is not allowed in a solution")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            problems.append(f"line {node.lineno}: private attribute .{node.attr} is not allowed")
    if not any(isinstance(n, ast.FunctionDef) and n.name == "solve" for n in tree.body):
        problems.append("solution.py must define solve(tools) at module level")
    return problems


def _db_problem(path: Path, workspace_db: Path) -> str | None:
    """What makes the frozen ``path`` not the environment's data; ``workspace_db`` is its source."""
    if any(os.path.lexists(f"{workspace_db}-{end}") for end in ("wal", "journal")):
        return "db.sqlite has a pending -wal/-journal file; close every connection (and commit) before submitting"
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        filled = [t for t in tables if db.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0] > 0]
    except sqlite3.DatabaseError as err:
        return f"db.sqlite is not a readable SQLite database ({err})"
    finally:
        db.close()
    return None if filled else "db.sqlite has no table with rows; store the environment's data in it"


def _harness(
    mode: str,
    args: list[str],
    cwd: Path,
    readable: list[Path],
    limits: Limits,
    script: str = HARNESS,
    stdin: str | None = None,
) -> dict:
    result = sandbox.run(
        [sys.executable, "-I", "-S", script, mode, *args],
        cwd=str(cwd),
        stdin=stdin,
        timeout_s=limits.timeout_s,
        memory_mb=limits.memory_mb,
        readable=[str(p) for p in readable] + [script],  # the one file of this project it runs
        kind=limits.isolation,
    )
    if result.timed_out or result.returncode != 0 or not result.stdout.strip():
        why = result.killed_reason or f"exit code {result.returncode}"
        return {"ok": False, "error": f"{mode} failed in the sandbox ({why}): {result.stderr[-800:]}"}
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_solution(code_dir: Path, db: Path, limits: Limits) -> tuple[dict, Path]:
    """``solve`` of ``code_dir``'s solution over a fresh copy of ``db``: (harness output, run dir
    holding the final ``db.sqlite``). The caller removes the run dir."""
    run_dir = Path(tempfile.mkdtemp(prefix="dsv32-synth-run-"))
    shutil.copyfile(db, run_dir / "db.sqlite")
    out = _harness("solve", [str(code_dir), "db.sqlite"], run_dir, [code_dir, db.parent], limits)
    return out, run_dir


def run_verifier(code_dir: Path, initial: Path, final: Path, answer: str, limits: Limits) -> dict:
    """``verify`` of ``code_dir`` through the ``general-tools`` runner (the same check its bundles get;
    the answer goes on its standard input, which holds any size)."""
    args = [str(code_dir), str(initial), str(final)]
    readable = [code_dir, initial.parent]
    return _harness("verify", args, final.parent, readable, limits, script=RUNNER, stdin=json.dumps(answer))


def _copy_regular(src: Path, dst: Path) -> None:
    """Copy ``src`` only if it is a regular file, never following a link: a link made in the sandbox
    could name a host file the sandbox hides, and the host must not read it on the agent's behalf."""
    if src.is_symlink():
        raise SynthError(f"{src.name} is a symbolic link")
    try:  # O_NOFOLLOW: a link swapped in after the check is refused too
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        raise SynthError(f"{src.name} cannot be read as a regular file ({err.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SynthError(f"{src.name} is not a regular file")
    with open(fd, "rb") as source, open(dst, "xb") as target:
        shutil.copyfileobj(source, target)


def freeze(workspace: Path, dest: Path) -> None:
    """Copy the version's files into a new ``dest``; :class:`SynthError` if one is a link or not a
    regular file."""
    dest.mkdir(parents=True)
    for name in VERSION_FILES:
        _copy_regular(workspace / name, dest / name)


def check_version(
    workspace: Path, prompt: str, index: int, dest: Path, previous: Version | None, limits: Limits
) -> Verdict:
    """Check the workspace as version ``index`` (see the module docstring); its files are frozen in
    ``dest`` (removed again when rejected)."""
    missing = [n for n in VERSION_FILES if not os.path.lexists(workspace / n)]
    if missing:
        return Verdict(
            False,
            f"missing {', '.join(missing)} in the workspace (a version needs {', '.join(VERSION_FILES)})",
        )
    if not prompt.strip():
        return Verdict(False, "the task prompt is empty; pass the task the solver will read as prompt")
    try:
        freeze(workspace, dest)
    except SynthError as err:
        sandbox.remove_tree(dest)
        return Verdict(False, f"{err}; a version is made of regular files, not links or directories")
    problem = _db_problem(dest / "db.sqlite", workspace / "db.sqlite")
    verdict = Verdict(False, problem) if problem else _check_frozen(dest, prompt, index, previous, limits)
    if not verdict.accepted:
        sandbox.remove_tree(dest)
    return verdict


def _check_frozen(code: Path, prompt: str, index: int, previous: Version | None, limits: Limits) -> Verdict:
    problems = solution_problems((code / "solution.py").read_text(encoding="utf-8"))
    if problems:
        return Verdict(False, "solution.py breaks the rules: " + "; ".join(problems[:5]))
    scratch = Path(tempfile.mkdtemp(prefix="dsv32-synth-schema-"))
    try:
        schema = _harness("schema", [str(code)], scratch, [code], limits)
    finally:
        sandbox.remove_tree(scratch)
    if not schema["ok"]:
        return Verdict(False, f"tools.py: {schema['error']}")
    db = code / "db.sqlite"
    solved, run_dir = run_solution(code, db, limits)
    try:
        if not solved["ok"]:
            return Verdict(False, f"the solution failed: {solved['error']}")
        if not solved["calls"]:
            return Verdict(False, "the solution calls no tool; a task must need the tools to be solved")
        verdict = run_verifier(code, db, run_dir / "db.sqlite", solved["answer"], limits)
        if not verdict["ok"]:
            return Verdict(False, f"the verifier failed: {verdict['error']}")
        if not verdict["passed"]:
            return Verdict(False, f"the solution's result fails its verifier: {verdict['reason']}")
    finally:
        sandbox.remove_tree(run_dir)
    for idle_answer in IDLE_ANSWERS:
        idle_dir = Path(tempfile.mkdtemp(prefix="dsv32-synth-idle-"))
        try:
            shutil.copyfile(db, idle_dir / "db.sqlite")
            idle = run_verifier(code, db, idle_dir / "db.sqlite", idle_answer, limits)
        finally:
            sandbox.remove_tree(idle_dir)
        if not idle["ok"] or idle["passed"]:
            why = (
                idle.get("error") or f"it accepts an episode that called no tool and answered {idle_answer!r}"
            )
            return Verdict(False, f"the verifier is too weak: {why}")
    harder = ""
    if previous is not None:
        is_harder, harder = _harder(code, prompt, schema["tools"], previous, limits)
        if not is_harder:
            return Verdict(False, harder)
    version = Version(index, prompt, code, schema["tools"], solved["calls"], solved["answer"], harder)
    return Verdict(True, "accepted", version)


def tool_changes(previous: list[dict], current: list[dict]) -> list[str]:
    """How ``current`` tool schemas break a solution written for ``previous``: a tool removed, a
    parameter removed or retyped, a required parameter added. Added tools and optional parameters
    break nothing."""
    now = {t["function"]["name"]: t["function"]["parameters"] for t in current}
    changes = []
    for tool in previous:
        name, before = tool["function"]["name"], tool["function"]["parameters"]
        after = now.get(name)
        if after is None:
            changes.append(f"tool {name} was removed")
            continue
        for param, spec in before["properties"].items():
            if param not in after["properties"]:
                changes.append(f"{name} lost parameter {param}")
            elif after["properties"][param] != spec:
                changes.append(f"{name}.{param} changed type")
        changes += [
            f"{name} gained required parameter {p}"
            for p in after["required"]
            if p not in before["properties"]
        ]
    return changes


def _harder(
    code: Path, prompt: str, tools: list[dict], previous: Version, limits: Limits
) -> tuple[bool, str]:
    """Whether version ``code`` (with ``tools``) is harder than ``previous``, and why (or why not)."""
    if normalize(prompt) == normalize(previous.prompt):
        return False, "not harder: the prompt is the same as the previous version's; change the task"
    changes = tool_changes(previous.tools, tools)
    if changes:  # the easier solution would fail for its calls, not for the task being harder
        return False, (
            f"not harder: it changes the previous version's tools ({'; '.join(changes[:3])}); keep every "
            "tool's name and parameters (add tools or optional parameters) so that the previous solution "
            "still runs, and make it fail the new verifier"
        )
    mixed = Path(tempfile.mkdtemp(prefix="dsv32-synth-prev-"))
    try:
        for name in ("tools.py", "verify.py"):
            shutil.copyfile(code / name, mixed / name)
        shutil.copyfile(previous.path / "solution.py", mixed / "solution.py")
        old, run_dir = run_solution(mixed, code / "db.sqlite", limits)
        try:
            if not old["ok"]:
                return True, "the previous solution no longer runs on the new tools and data"
            verdict = run_verifier(mixed, code / "db.sqlite", run_dir / "db.sqlite", old["answer"], limits)
        finally:
            sandbox.remove_tree(run_dir)
    finally:
        sandbox.remove_tree(mixed)
    if verdict.get("ok") and verdict.get("passed"):
        return (
            False,
            "not harder: the previous version's solution still passes the new verifier; add constraints",
        )
    return True, "the previous version's solution fails the new verifier"
