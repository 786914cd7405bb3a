"""General-agent environment synthesis (paper §3.2.3, "General Agent"): one episode of the loop.

Given a task category, a synthesizing agent in a sandbox (:mod:`.workspace`: bash, files, optional
search, ``submit_version``):

1. generates or retrieves data and stores it in ``db.sqlite``;
2. writes task-specific tools as Python functions over that database (``tools.py``);
3. proposes a simple task with a Python solution that only calls the tools or computes
   (``solution.py``) and a Python verifier (``verify.py``), and submits it; the host runs both in the
   sandbox and the agent repairs them until the solution passes (:mod:`.versions`);
4. makes the task harder step by step, adding tools when the current ones are not enough; a harder
   version is kept only if its own solution passes its verifier and the previous solution does not.

Every accepted version becomes one bundle in the ``general-tools`` format of
:mod:`dsv32.envs.general.bundle` (task.json with the reference calls the solution made and its
answer, db.sqlite, tools.json, tools.py, verify.py; solution.py kept beside them), and is kept only
if the ``general-tools`` environment itself, replaying the reference through its sandboxed tools,
gives reward 1 — so every kept bundle loads and runs like the shipped ones.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dsv32.agent import Agent
from dsv32.envs.base import Task, replay
from dsv32.envs.general.bundle import load_bundle
from dsv32.envs.general.env import GeneralToolEnv
from dsv32.synth.prompts import GENERAL_SYSTEM, GENERAL_USER, SEARCH_HINT
from dsv32.synth.records import JobFailed, Pricing, SynthError, tool_signature
from dsv32.synth.runner import Item, JobResult
from dsv32.synth.versions import SOLUTION_IMPORTS, Limits, Version, freeze
from dsv32.synth.workspace import Workspace


@dataclass
class GeneralConfig:
    """One synthesis episode's settings. ``corpus``: None (no search tool), ``"stdlib"`` or a JSONL
    corpus path for ``search``/``open``."""

    category: str
    max_versions: int = 4
    max_steps: int = 60
    thinking: bool = True
    sampling: dict = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    bash_timeout_s: float = 60.0
    corpus: str | None = None

    def __post_init__(self) -> None:
        if not self.category.strip():
            raise SynthError("the task category is empty; name one, e.g. 'trip planning'")
        if self.max_versions < 1 or self.max_steps < 1:
            raise SynthError("max_versions and max_steps must be at least 1")


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "task"


def export_bundle(version: Version, dest: Path, task_id: str, category: str, provenance: dict) -> Path:
    """Write ``version`` as a ``general-tools`` bundle in ``dest`` and check its layout."""
    freeze(version.path, dest)
    task = {
        "id": task_id,
        "prompt": version.prompt,
        "category": category,
        "difficulty": version.index,
        "reference": {"calls": version.calls, "answer": version.answer},
        "provenance": provenance,
    }
    (dest / "task.json").write_text(json.dumps(task, indent=1, ensure_ascii=False), encoding="utf-8")
    (dest / "tools.json").write_text(json.dumps(version.tools, indent=1), encoding="utf-8")
    load_bundle(dest)
    return dest


def replay_reward(bundle: Path, task_id: str, isolation: str | None = None) -> tuple[float, str]:
    """The ``general-tools`` environment's reward for the bundle's own reference solution."""
    task = Task(task_id, load_bundle(bundle).task["prompt"], info={"bundle": str(bundle)})
    with GeneralToolEnv(isolation=isolation) as env:
        episode = replay(env, task, env.reference(task))
        reward = env.reward(episode)
    return reward.value, reward.reason


def synthesize(
    backend: Any,
    config: GeneralConfig,
    key: str,
    staging: Path,
    *,
    pricing: Pricing | None = None,
    provenance: dict | None = None,
    on_event: Any = None,
    retry_errors: bool = True,
) -> JobResult:
    """Run one synthesis episode with ``backend``; accepted versions become bundles under ``staging``.

    An episode whose backend failed (``stop_reason == "error"``: an endpoint that kept failing after
    its retries) before any version was accepted says nothing about the category, so with
    ``retry_errors`` it raises :class:`JobFailed`: the job is logged as an error and runs again on
    the next run. Versions accepted before such a failure are checked tasks and are kept. Without
    ``retry_errors`` (a local model, whose only backend failure is a full window, the same on every
    run) the episode is dropped like any other without a version."""
    result = JobResult(key)
    workspace = Workspace.create(limits=config.limits, max_versions=config.max_versions,
                                 bash_timeout_s=config.bash_timeout_s)  # fmt: skip
    try:
        search_env = None
        if config.corpus is not None:
            from dsv32.envs.search import SearchEnv

            search_env = SearchEnv(None if config.corpus == "stdlib" else config.corpus)
        system = GENERAL_SYSTEM.format(
            search=", `search` and `open` (a reference corpus)" if search_env else "",
            versions=config.max_versions,
            imports=", ".join(sorted(SOLUTION_IMPORTS)),
        )
        agent = Agent(
            backend, workspace.tools(search_env), system=system, thinking=config.thinking,
            max_steps=config.max_steps, sampling=config.sampling, tool_timeout_s=None, on_event=on_event,
        )  # fmt: skip
        user = GENERAL_USER.format(category=config.category, hint=SEARCH_HINT if search_env else "")
        trajectory = agent.run(user)
        result.usage.role("generator", pricing).add_trajectory(trajectory)
        result.stats = {
            "category": config.category,
            "stop_reason": trajectory.stop_reason,
            "steps": len(trajectory.steps),
            "submissions": [asdict(s) for s in workspace.submissions],
            "accepted_versions": len(workspace.versions),
        }
        if trajectory.error:
            result.stats["error"] = trajectory.error
        if retry_errors and trajectory.stop_reason == "error" and not workspace.versions:
            raise JobFailed(f"the generator failed before any version was accepted: {trajectory.error}",
                            result.usage)  # fmt: skip
        if not workspace.versions:
            result.dropped.append({"reason": "no accepted version", "stop_reason": trajectory.stop_reason})
        for version in workspace.versions:
            _keep(result, version, config, staging, provenance or {})
    finally:
        workspace.close()
    return result


def _keep(
    result: JobResult, version: Version, config: GeneralConfig, staging: Path, provenance: dict
) -> None:
    task_id = f"{slug(config.category)}-{result.key}-v{version.index}"
    bundle = export_bundle(version, staging / task_id, task_id, config.category, provenance)
    value, reason = replay_reward(bundle, task_id, config.limits.isolation)
    if value != 1.0:
        shutil.rmtree(bundle, ignore_errors=True)
        result.dropped.append({"reason": "reference replay failed in general-tools", "version": version.index,
                               "detail": reason})  # fmt: skip
        return
    row = {
        "id": task_id,
        "prompt": version.prompt,
        "answer": None,
        "domain": config.category,
        "info": {
            "difficulty": version.index,
            "reference_calls": len(version.calls),
            "harder": version.harder,
        },
    }
    result.items.append(Item(row, version.prompt, tool_signature(version.tools), bundle))
