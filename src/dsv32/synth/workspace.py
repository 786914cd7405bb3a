"""The synthesizing agent's sandbox (paper §3.2.3): a work directory and the tools it acts through.

- ``bash(command)``: ``bash -c command`` in :func:`dsv32.envs.sandbox.run` with the work directory as
  its only writable place (no network, CPU/memory/process limits, killed on timeout);
- ``write_file(path, content)`` / ``read_file(path)``: files under the work directory (a path that
  leaves it is refused);
- ``search(query, k)`` / ``open(doc_id, page)``: the search environment's tools over a corpus, when
  one is given (the paper's retrieval of data; here any local BM25 corpus);
- ``submit_version(prompt)``: the host checks the workspace as the next version of the task
  (:func:`dsv32.synth.versions.check_version`) and answers with the verdict.

Every tool returns text the agent reads; none raises for what the agent did.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from dsv32.agent import Tool, tool
from dsv32.envs import sandbox
from dsv32.envs.base import tool_schema
from dsv32.synth.versions import Limits, Version, check_version

MAX_READ_CHARS = 20_000


@dataclass
class Submission:
    """One ``submit_version`` call: accepted or why not."""

    index: int
    prompt: str
    accepted: bool
    reason: str


@dataclass
class Workspace:
    """One synthesis episode's state: the work dir, the accepted versions and every submission."""

    root: Path
    limits: Limits = field(default_factory=Limits)
    max_versions: int = 4
    bash_timeout_s: float = 60.0
    versions: list[Version] = field(default_factory=list)
    submissions: list[Submission] = field(default_factory=list)

    @classmethod
    def create(cls, **options) -> Workspace:
        root = Path(tempfile.mkdtemp(prefix="dsv32-synth-ws-"))
        (root / "work").mkdir()
        (root / "versions").mkdir()
        return cls(root, **options)

    @property
    def work(self) -> Path:
        return self.root / "work"

    def close(self) -> None:
        sandbox.remove_tree(self.root)

    # ------------------------------------------------------------------------------ the tools
    def bash(self, command: str) -> str:
        result = sandbox.run(
            ["bash", "-c", command],
            cwd=str(self.work),
            timeout_s=self.bash_timeout_s,
            memory_mb=self.limits.memory_mb,
            kind=self.limits.isolation,
            output_bytes=64 << 10,
        )
        text = f"exit code {result.returncode}"
        if result.killed_reason:
            text += f" (killed: {result.killed_reason})"
        if result.stdout:
            text += f"\nstdout:\n{result.stdout[-8000:]}"
        if result.stderr:
            text += f"\nstderr:\n{result.stderr[-4000:]}"
        return text

    def _inside(self, path: str) -> Path | None:
        target = (self.work / path).resolve()
        return (
            target if target.is_relative_to(self.work.resolve()) and target != self.work.resolve() else None
        )

    def write_file(self, path: str, content: str) -> str:
        target = self._inside(path)
        if target is None:
            return f"error: {path!r} is outside the sandbox directory; use a relative path inside it"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        return f"wrote {len(content)} characters to {path}"

    def read_file(self, path: str) -> str:
        target = self._inside(path)
        if target is None or not target.is_file():
            return f"error: no file {path!r} in the sandbox directory"
        text = target.read_text(encoding="utf-8", errors="replace")
        return text[:MAX_READ_CHARS] + (
            f"\n[... {len(text) - MAX_READ_CHARS} more characters]" if len(text) > MAX_READ_CHARS else ""
        )

    def submit_version(self, prompt: str) -> str:
        if len(self.versions) >= self.max_versions:
            return (
                f"the limit of {self.max_versions} versions is reached; stop and answer without a tool call"
            )
        index = len(self.versions) + 1
        dest = self.root / "versions" / f"v{index}-{len(self.submissions)}"
        previous = self.versions[-1] if self.versions else None
        verdict = check_version(self.work, prompt, index, dest, previous, self.limits)
        self.submissions.append(Submission(index, prompt, verdict.accepted, verdict.reason))
        if not verdict.accepted:
            return f"version {index} rejected: {verdict.reason}"
        assert verdict.version is not None
        self.versions.append(verdict.version)
        calls = len(verdict.version.calls)
        left = self.max_versions - len(self.versions)
        text = f"version {index} accepted (the solution makes {calls} tool call(s))."
        if verdict.version.harder:
            text += f" Harder: {verdict.version.harder}."
        return text + (
            f" Make the task harder and submit again ({left} more allowed)." if left else " Stop now."
        )

    def tools(self, search_env=None) -> list[Tool]:
        """The agent's tools; ``search_env`` (a :class:`dsv32.envs.search.SearchEnv`) adds search/open."""
        out = [
            tool(self.bash, schema=tool_schema("bash", "Run a bash command in the sandbox directory (no network).",
                                               {"command": {"type": "string"}})),
            tool(self.write_file, schema=tool_schema("write_file", "Write a text file in the sandbox directory.",
                                                     {"path": {"type": "string"}, "content": {"type": "string"}})),
            tool(self.read_file, schema=tool_schema("read_file", "Read a text file of the sandbox directory.",
                                                    {"path": {"type": "string"}})),
            tool(self.submit_version, schema=tool_schema(
                "submit_version",
                "Submit the workspace (db.sqlite, tools.py, solution.py, verify.py) as the next version of the task.",
                {"prompt": {"type": "string", "description": "the task text the solver reads"}},
            ), timeout_s=max(120.0, 8 * self.limits.timeout_s)),
        ]  # fmt: skip
        if search_env is not None:
            for schema in search_env.tools():
                name = schema["function"]["name"]

                def call(_name: str = name, **arguments) -> str:
                    return search_env.call(_name, arguments)

                out.append(tool(call, schema=schema))
        return out
