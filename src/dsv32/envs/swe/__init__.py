"""The code-repository environment (paper §3.2.3, SWE-bench style) and its task miner.

Importing this package registers the ``swe`` environment. Its task set ``mined`` is
``tasks.jsonl`` next to this file: bugs injected into three small pure-Python packages from the
package index (each task names ``NAME==VERSION``; the source is downloaded and cached on first use,
never stored here). :func:`build_swe_tasks` mines more from any package whose sdist ships its tests.
"""

from __future__ import annotations

from pathlib import Path

from dsv32.envs.base import EnvSpec, Task, load_tasks, register
from dsv32.envs.swe.env import SweEnv
from dsv32.envs.swe.mine import build_swe_tasks, mine
from dsv32.envs.swe.snapshot import Edit, materialize, pristine
from dsv32.envs.swe.testrun import TestReport, parse_junit, run_pytest

SHIPPED_TASKS = Path(__file__).with_name("tasks.jsonl")


def mined_tasks() -> list[Task]:
    """The shipped task set."""
    return load_tasks(SHIPPED_TASKS)


register(EnvSpec("swe", SweEnv.description, SweEnv, {"mined": mined_tasks}))

__all__ = [
    "SHIPPED_TASKS",
    "Edit",
    "SweEnv",
    "TestReport",
    "build_swe_tasks",
    "materialize",
    "mine",
    "mined_tasks",
    "parse_junit",
    "pristine",
    "run_pytest",
]
