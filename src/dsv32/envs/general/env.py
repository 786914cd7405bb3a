"""``general-tools``: a task bundle's tools over its SQLite database, and its verifier (paper §3.2.3,
"General Agent"; the shape of Agent World Model / τ²-bench).

Each episode copies the bundle's ``db.sqlite`` into its own work dir; every tool call and the final
verification run :mod:`.runner` in a fresh sandboxed process (no network, read-only filesystem but
the work dir), so a bundle's code never runs in the host. A tool call sees, of the bundle, only
``tools.py``: not ``verify.py``, ``task.json`` (the reference answer) or the initial database the
verifier compares against, so even a tool that reads or writes files on the model's say-so (a
synthesized bundle's mistake) reaches nothing but the episode's own database. Reward: 1 when
``verify(initial_db, final_db, answer)`` accepts, else 0, with the verifier's reason.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from dsv32.envs import sandbox
from dsv32.envs.base import EnvError, Environment, Reward, Task, TrajectoryLike, lone_surrogate, tool_call
from dsv32.envs.general.bundle import Bundle, load_bundle

RUNNER = str(Path(__file__).with_name("runner.py"))
SYSTEM_PROMPT = (
    "You are an assistant who completes the user's task with the tools provided; they read and change "
    "a database. Look up what you need before acting, follow every constraint in the task, and when "
    "you are done, reply with a short final answer as the task asks."
)


class GeneralToolEnv(Environment):
    """One episode over one bundle (``task.info["bundle"]``: the bundle's directory)."""

    name = "general-tools"
    description = (
        "tool-use tasks over a SQLite database (trip planning, inventory, calendars); a sandboxed verifier"
    )

    def __init__(
        self, *, call_timeout_s: float = 20, memory_mb: int = 512, isolation: str | None = None
    ) -> None:
        self.call_timeout_s, self.memory_mb, self.isolation = call_timeout_s, memory_mb, isolation
        self.task: Task | None = None
        self.bundle: Bundle | None = None
        self.workdir: str | None = None
        self.calls: list[dict] = []

    def _bundle_of(self, task: Task) -> Bundle:
        where = task.info.get("bundle")
        if not isinstance(where, str):
            raise EnvError(f"task {task.id!r}: general-tools tasks need info.bundle, a bundle directory")
        return load_bundle(where)

    def reset(self, task: Task) -> list[dict]:
        self.close()
        self.task, self.bundle, self.calls = task, self._bundle_of(task), []
        self.workdir = tempfile.mkdtemp(prefix="dsv32-general-")
        shutil.copyfile(self.bundle.db, Path(self.workdir, "db.sqlite"))
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.prompt}]

    def tools(self) -> list[dict]:
        if self.bundle is None:
            raise EnvError("tools() before reset(): the tools come with the task's bundle")
        return self.bundle.tools

    def _run(self, *args: str, data: str = "", sees: list[str] | None = None) -> dict:
        """:mod:`.runner` with ``args``, and ``data`` (JSON: a call's arguments, an answer) on its
        standard input, which holds any size (a program argument holds at most 128 KiB). The process
        sees ``sees`` (default: the whole bundle) of the bundle, read-only."""
        assert self.bundle is not None and self.workdir is not None
        result = sandbox.run(
            [sys.executable, "-I", "-S", RUNNER, *args],
            cwd=self.workdir,
            stdin=data,
            timeout_s=self.call_timeout_s,
            memory_mb=self.memory_mb,
            readable=[*(sees or [str(self.bundle.path)]), RUNNER],
            kind=self.isolation,
        )
        if result.timed_out or result.returncode != 0:
            why = result.killed_reason or f"exit code {result.returncode}"
            return {"ok": False, "error": f"the call failed in the sandbox ({why}): {result.stderr[-500:]}"}
        lines = result.stdout.strip().splitlines()
        try:
            out = json.loads(lines[-1])
        except (IndexError, ValueError):
            out = None
        if not isinstance(out, dict) or not isinstance(out.get("ok"), bool):
            return {"ok": False, "error": "the call failed in the sandbox (it printed no JSON result)"}
        return out

    def check(self, task: Task) -> dict:
        """The bundle's self-check in one sandboxed process (see :mod:`.runner`): ``failed_calls``
        of the reference, and the verdicts ``reference`` (should pass), ``empty_answer`` and
        ``untouched`` (should fail), each ``{"passed", "reason"}``. For generators and synthesizers."""
        self.reset(task)
        assert self.bundle is not None
        out = self._run("check", str(self.bundle.path), "db.sqlite")
        if not out["ok"]:
            raise EnvError(f"task bundle {self.bundle.path}: its self-check failed: {out['error']}")
        return out

    def call(self, name: str, arguments: dict) -> str:
        if self.bundle is None:
            raise EnvError("call() before reset(): start an episode with env.reset(task)")
        known = [t["function"]["name"] for t in self.bundle.tools]
        if name not in known:
            return f"error: unknown tool {name!r}; the tools are {', '.join(known)}"
        if not isinstance(arguments, dict):
            return "error: tool arguments must be a JSON object"
        if problem := lone_surrogate(arguments):
            return problem
        # a tool sees its own code, never the verifier, the task (its reference answer) or the initial
        # database: whatever a tool does with the model's arguments, it cannot read or change them
        tools = str(self.bundle.path / "tools.py")
        out = self._run(
            "call", str(self.bundle.path), "db.sqlite", name, data=json.dumps(arguments), sees=[tools]
        )
        self.calls.append({"name": name, "ok": out["ok"]})
        return json.dumps(out["result"], ensure_ascii=False) if out["ok"] else f"error: {out['error']}"

    def reward(self, trajectory: TrajectoryLike) -> Reward:
        if self.bundle is None:
            raise EnvError("reward() before reset(): there is no task to verify")
        answer = json.dumps(trajectory.final or "")
        out = self._run("verify", str(self.bundle.path), str(self.bundle.db), "db.sqlite", data=answer)
        if not out["ok"]:
            return Reward(0.0, {"verified": 0.0}, f"the verifier failed: {out['error']}")
        return Reward(float(out["passed"]), {"verified": float(out["passed"])}, out["reason"])

    def reference(self, task: Task) -> list[dict]:
        """The bundle's reference calls, one assistant turn each, then its answer."""
        ref = self._bundle_of(task).task.get("reference") or {}
        turns = [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [tool_call(c["name"], c["arguments"], f"ref-{i}")],
            }
            for i, c in enumerate(ref.get("calls", []))
        ]
        return [*turns, {"role": "assistant", "content": ref.get("answer", "")}]

    def state(self) -> dict:
        return {
            "task": self.task.id if self.task else None,
            "calls": list(self.calls),
            "workdir": self.workdir,
        }

    def close(self) -> None:
        if self.workdir is not None:
            sandbox.remove_tree(self.workdir)
            self.workdir = None


class SynthGeneralEnv(GeneralToolEnv):
    """The ``general-tools`` runtime under its own name for synthesized environments — the bundles of
    ``dsv32 synth envs`` (programmatic) and ``dsv32 synth general`` (the LLM loop) — so an RL recipe
    mixes them with the hand-written generators under a domain key of their own. It ships no task
    set: a set is a directory the synthesizer wrote, and its tasks are that directory's JSONL files
    (``tasks = "DIR/train.jsonl"``, ``eval_tasks = "DIR/heldout.jsonl"``)."""

    name = "synth-general"
    description = (
        "synthesized general-agent environments (dsv32 synth envs / synth general bundles); tasks from "
        "the set's JSONL files"
    )
