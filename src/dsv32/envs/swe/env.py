"""The code-repository (SWE-style) environment: fix a bug in a real package so its tests pass.

A task (SWE-bench's field names under ``info``): ``package`` (``NAME==VERSION``), ``bug`` (exact
string edits that turn the released source into the buggy snapshot), ``FAIL_TO_PASS`` and
``PASS_TO_PASS`` (pytest node ids), ``pythonpath`` (``.`` or ``src``), optionally ``patch`` (the
fix as a unified diff, for people). Each episode works on its own copy of the snapshot.

Tools: ``bash`` (sandboxed in the repository: no network, only the repository writable),
``read_file``, ``edit_file`` (replace one exact occurrence) and ``run_tests``. The reward runs the
suite in the sandbox on a fresh copy of the snapshot that takes only the library code from the
episode's repository (:func:`~dsv32.envs.swe.snapshot.scoring_tree`: tests, ``conftest.py`` files and
pytest configuration are the snapshot's, as SWE-bench re-applies its test patch): 1 when every
``FAIL_TO_PASS`` test passes and no ``PASS_TO_PASS`` test fails, else 0, where a test passes when
pytest's JUnit report and the seal that vouches for its run (:mod:`~dsv32.envs.swe.seal`: pytest
intact, the genuine test body run to its end) both say so. The tools read only regular files of the repository; a bad call is an ``error:`` text.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from dsv32.envs import sandbox
from dsv32.envs.base import (
    EnvError,
    Environment,
    Reward,
    Task,
    TrajectoryLike,
    lone_surrogate,
    tool_call,
    tool_schema,
)
from dsv32.envs.swe.snapshot import Edit, SnapshotError, apply_edit, materialize, read_text, scoring_tree
from dsv32.envs.swe.testrun import TestReport, check_pythonpath, run_pytest, summarize, test_env

OUTPUT_CHARS = 12000
READ_LINES = 200
LINE_CHARS = 2000  # the most characters of one line read_file shows

SYSTEM = (
    "You are fixing a bug in the Python package {package}. Its source tree (with its tests) is your "
    "working directory. Tools: `bash` runs a shell command in the repository (no network; `python` and "
    "`pytest` are available), `read_file` shows a file with line numbers, `edit_file` replaces one exact "
    "occurrence of a text in a file, `run_tests` runs pytest (the whole suite, or the test ids you give) "
    "and lists the failures. Find the cause, fix the library code (not the tests), check with "
    "`run_tests`, then reply with a short summary of the fix."
)


def _clip(line: str) -> str:
    if len(line) <= LINE_CHARS:
        return line
    return f"{line[:LINE_CHARS]} ... [{len(line) - LINE_CHARS} more characters]"


def _require(task: Task) -> None:
    info = task.info
    for key, kind in (("package", str), ("bug", list), ("FAIL_TO_PASS", list), ("PASS_TO_PASS", list)):
        if not isinstance(info.get(key), kind):
            raise EnvError(f"SWE task {task.id!r}: info.{key} must be a {kind.__name__}")
    if not info["FAIL_TO_PASS"]:
        raise EnvError(f"SWE task {task.id!r}: FAIL_TO_PASS is empty, so nothing shows the bug is fixed")
    try:
        check_pythonpath(info.get("pythonpath", "."))
    except EnvError as err:
        raise EnvError(f"SWE task {task.id!r}: info.{err}") from None


class SweEnv(Environment):
    name = "swe"
    description = "fix an injected bug in a real package so its FAIL_TO_PASS tests pass (SWE-bench style)"

    def __init__(
        self, bash_timeout_s: float = 60, test_timeout_s: float = 300, memory_mb: int = 4096
    ) -> None:
        self.bash_timeout_s, self.test_timeout_s, self.memory_mb = bash_timeout_s, test_timeout_s, memory_mb
        self.task: Task | None = None
        self.tmp: Path | None = None
        self.repo: Path | None = None
        self.calls: list[dict] = []
        self.last: TestReport | None = None

    def reset(self, task: Task) -> list[dict]:
        _require(task)
        self.close()
        self.task, self.calls, self.last = task, [], None
        self.tmp = Path(tempfile.mkdtemp(prefix="dsv32-swe-"))
        edits = [Edit.from_dict(e) for e in task.info["bug"]]
        self.repo = materialize(task.info["package"], edits, self.tmp / "repo")
        (self.tmp / "scratch").mkdir()
        return [
            {"role": "system", "content": SYSTEM.format(package=task.info["package"])},
            {"role": "user", "content": task.prompt},
        ]

    def tools(self) -> list[dict]:
        return [
            tool_schema("bash", "Run a bash command in the repository (sandboxed, no network).",
                        {"command": {"type": "string", "description": "the command line"}}),
            tool_schema("read_file", f"Show a file with line numbers (at most {READ_LINES} lines a call).", {
                "path": {"type": "string", "description": "path relative to the repository"},
                "start_line": {"type": "integer", "description": "first line to show (default 1)"},
                "end_line": {"type": "integer", "description": "last line to show"},
            }, required=["path"]),
            tool_schema("edit_file", "Replace the one exact occurrence of old_str in a file by new_str.", {
                "path": {"type": "string", "description": "path relative to the repository"},
                "old_str": {"type": "string", "description": "text that occurs exactly once in the file"},
                "new_str": {"type": "string", "description": "replacement text"},
            }),
            tool_schema("run_tests", "Run pytest and list the failing tests with their messages.", {
                "tests": {"type": "array", "items": {"type": "string"},
                          "description": "pytest node ids or test files (default: the whole suite)"},
            }, required=[]),
        ]  # fmt: skip

    def call(self, name: str, arguments: dict) -> str:
        if self.repo is None:
            return "error: no episode is running (reset first)"
        handler = {
            "bash": self._bash,
            "read_file": self._read,
            "edit_file": self._edit,
            "run_tests": self._tests,
        }
        if name not in handler:
            out = f"error: unknown tool {name!r}; the tools are {', '.join(handler)}"
        elif not isinstance(arguments, dict):
            out = f"error: the arguments of {name} must be a JSON object, got {type(arguments).__name__}"
        elif problem := lone_surrogate(arguments):
            out = problem
        else:
            try:
                out = handler[name](arguments)
            except (SnapshotError, OSError, UnicodeError) as err:
                out = f"error: {err}"
        self.calls.append({"tool": name, "error": out.startswith("error:")})
        return out

    def _bash(self, args: dict) -> str:
        command = args.get("command")
        if not isinstance(command, str) or not command.strip():
            return "error: bash needs a non-empty string 'command'"
        if "\0" in command:
            return "error: the command contains a NUL byte, which no program argument can hold"
        env = test_env(self.repo, self.task.info.get("pythonpath", "."), self.tmp / "scratch")
        done = sandbox.run(["bash", "-c", command], cwd=self.repo, timeout_s=self.bash_timeout_s,
                           memory_mb=self.memory_mb, env=env, writable=[str(self.tmp / "scratch")])  # fmt: skip
        out = (done.stdout + (f"\n[stderr]\n{done.stderr}" if done.stderr else ""))[-OUTPUT_CHARS:]
        note = f" ({done.killed_reason})" if done.killed_reason else ""
        return f"exit code {done.returncode}{note}\n{out}"

    def _read(self, args: dict) -> str:
        path, start = args.get("path"), args.get("start_line", 1)
        if not isinstance(path, str) or not isinstance(start, int) or start < 1:
            return "error: read_file needs a string 'path' and a positive integer 'start_line'"
        lines = read_text(self.repo, path).splitlines()
        end = args.get("end_line", start + READ_LINES - 1)
        if not isinstance(end, int) or end < start:
            return "error: 'end_line' must be an integer not before 'start_line'"
        end = min(end, start + READ_LINES - 1, len(lines))
        shown = "\n".join(f"{i:6d}\t{_clip(lines[i - 1])}" for i in range(start, end + 1))
        return f"{path} (lines {start}-{end} of {len(lines)})\n{shown}"

    def _edit(self, args: dict) -> str:
        path, old, new = args.get("path"), args.get("old_str"), args.get("new_str")
        if not all(isinstance(x, str) for x in (path, old, new)) or not old:
            return "error: edit_file needs strings 'path', 'old_str' (non-empty) and 'new_str'"
        apply_edit(self.repo, Edit(path, old, new))
        return f"edited {path}"

    def _tests(self, args: dict) -> str:
        tests = args.get("tests") or []
        if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
            return "error: 'tests' must be a list of pytest node ids or paths"
        if any("\0" in t for t in tests):
            return "error: a test id contains a NUL byte"
        self.last = run_pytest(self.repo, pythonpath=self.task.info.get("pythonpath", "."), args=tests,
                               timeout_s=self.test_timeout_s, memory_mb=self.memory_mb)  # fmt: skip
        return summarize(self.last)

    def reward(self, trajectory: TrajectoryLike) -> Reward:
        if self.repo is None:
            raise EnvError("reward() before reset(): start an episode with env.reset(task)")
        info = self.task.info
        f2p_ids, p2p_ids = info["FAIL_TO_PASS"], info["PASS_TO_PASS"]
        tree = self.tmp / "scored"
        sandbox.remove_tree(tree)
        try:
            left_out = scoring_tree(info["package"], self.repo, tree, edited=[e["path"] for e in info["bug"]],
                                    tests=[t.split("::", 1)[0] for t in f2p_ids + p2p_ids])  # fmt: skip
        except SnapshotError as err:
            sandbox.remove_tree(tree)
            return Reward(0.0, {"fail_to_pass": 0.0, "pass_to_pass": 0.0}, f"not scored: {err}")
        try:
            report = run_pytest(tree, pythonpath=info.get("pythonpath", "."), timeout_s=self.test_timeout_s,
                                memory_mb=self.memory_mb)  # fmt: skip
        finally:
            sandbox.remove_tree(tree)
        f2p = [t for t in f2p_ids if report.passed(t)]
        p2p = [t for t in p2p_ids if report.passed(t)]
        f2p_rate = len(f2p) / len(f2p_ids)
        p2p_rate = len(p2p) / len(p2p_ids) if p2p_ids else 1.0
        value = float(f2p_rate == 1.0 and p2p_rate == 1.0)
        reason = f"FAIL_TO_PASS {len(f2p)}/{len(f2p_ids)} pass, PASS_TO_PASS {len(p2p)}/{len(p2p_ids)} pass"
        if left_out:
            reason += f"; left out of the scored copy: {'; '.join(left_out[:5])}"
            reason += f" and {len(left_out) - 5} more" if len(left_out) > 5 else ""
        if report.harness:
            reason += f"; {report.harness}"
        if not report.outcomes:
            reason += f"; pytest gave no results (exit {report.returncode}): {report.output[-500:]}"
        return Reward(value, {"fail_to_pass": f2p_rate, "pass_to_pass": p2p_rate}, reason)

    def reference(self, task: Task) -> list[dict]:
        _require(task)
        messages = []
        for n, row in enumerate(task.info["bug"], 1):
            fix = Edit.from_dict(row).inverse()
            args = {"path": fix.path, "old_str": fix.old, "new_str": fix.new}
            messages.append(
                {"role": "assistant", "content": "", "tool_calls": [tool_call("edit_file", args, f"ref-{n}")]}
            )
        tests = {"tests": task.info["FAIL_TO_PASS"]}
        messages.append(
            {"role": "assistant", "content": "", "tool_calls": [tool_call("run_tests", tests, "ref-tests")]}
        )
        messages.append(
            {"role": "assistant", "content": "Reverted the faulty change; the failing tests pass."}
        )
        return messages

    def state(self) -> dict:
        return {
            "task": self.task.id if self.task else None,
            "repo": str(self.repo) if self.repo else None,
            "tool_calls": len(self.calls),
            "errors": sum(1 for c in self.calls if c["error"]),
            "last_tests": summarize(self.last).splitlines()[0] if self.last else None,
        }

    def close(self) -> None:
        if self.tmp is not None:
            sandbox.remove_tree(self.tmp)
        self.tmp = self.repo = None
