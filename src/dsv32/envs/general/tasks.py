"""The general-tools task sets: bundles from the three procedural generators, materialized on first use.

``generate(n, seed=..., difficulty=None, categories=...)`` writes ``n`` bundles (cycling through the
categories, and through difficulties 1–5 unless one is given) under a directory and returns their
:class:`Task` rows (``info.bundle`` = the bundle's path). The shipped sets live in the cache
(``dsv32.paths.cache_dir("envs", "general")``), keyed by a digest of the generators' code, so a
changed generator never serves stale bundles; a set is written to a temporary directory and renamed
into place, so concurrent first uses do not collide.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from dsv32.envs.base import Task, task_plan
from dsv32.envs.general import calendar, inventory, trip
from dsv32.envs.general.bundle import Bundle, load_bundle
from dsv32.paths import cache_dir

GENERATORS = {"trip": trip.generate, "inventory": inventory.generate, "calendar": calendar.generate}
CATEGORIES = tuple(GENERATORS)


def task_of(bundle: str | Path | Bundle) -> Task:
    """The task row of a bundle (or of a bundle directory)."""
    if not isinstance(bundle, Bundle):
        bundle = load_bundle(bundle)
    info = {
        "bundle": str(bundle.path),
        "category": bundle.task.get("category"),
        "difficulty": bundle.task.get("difficulty"),
    }
    return Task(str(bundle.task.get("id", bundle.path.name)), bundle.task["prompt"], None, "general", info)


def generate(
    n: int,
    out: str | Path,
    *,
    seed: int = 0,
    difficulty: int | None = None,
    categories: tuple[str, ...] = CATEGORIES,
) -> list[Task]:
    tasks = []
    for i, category, d, rng in task_plan(n, seed, difficulty, categories, GENERATORS, "general-task"):
        task_id = f"{category}-{seed}-{i:04d}"
        tasks.append(task_of(GENERATORS[category](rng, d, task_id, Path(out, task_id))))
    return tasks


def _digest() -> str:
    here = Path(__file__).parent
    files = sorted([*here.glob("*.py"), *(here / "sources").glob("*.py")])
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:12]


def shipped(name: str, n: int, seed: int, difficulty: int | None = None) -> list[Task]:
    """A shipped set, written to the cache on first use."""
    where = cache_dir("envs", "general", f"{name}-{_digest()}")
    if not where.is_dir():
        where.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=where.parent))
        generate(n, tmp, seed=seed, difficulty=difficulty)
        try:
            tmp.rename(where)
        except OSError:  # another process put the same set there first
            shutil.rmtree(tmp, ignore_errors=True)
    return [task_of(p) for p in sorted(where.iterdir()) if p.is_dir()]


TASK_SETS: dict[str, Callable[[], list[Task]]] = {
    "train": lambda: shipped("train", 30, seed=0),
    "heldout": lambda: shipped("heldout", 15, seed=1),
    "smoke": lambda: shipped("smoke", 3, seed=2, difficulty=1),
}
