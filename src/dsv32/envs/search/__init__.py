"""The search environment (paper §3.2.3): BM25 ``search`` and paged ``open`` over a local corpus,
with introspection-generated questions over the Python standard library as its task set.

Importing this package registers the ``search`` environment; its task set ``stdlib`` (100
questions, seed 0) is generated from the running Python on first use and cached per version.
"""

from __future__ import annotations

from pathlib import Path

from dsv32.envs.base import EnvSpec, Task, load_tasks, register, save_tasks
from dsv32.envs.search.answers import extract, matches
from dsv32.envs.search.corpus import Doc, load_corpus, python_tag, stdlib_cache
from dsv32.envs.search.env import SearchEnv, shared_index
from dsv32.envs.search.index import Index
from dsv32.envs.search.questions import GENERATOR_VERSION, generate

STDLIB_TASKS = 100


def build_search_tasks(n: int, out: str | Path, seed: int = 0) -> Path:
    """Write ``n`` questions over the standard-library corpus of this Python to ``out`` (JSONL)."""
    index = shared_index(None)
    return save_tasks(generate(index.docs, index, n, seed, corpus=f"stdlib-{python_tag()}"), out)


def stdlib_tasks(n: int = STDLIB_TASKS, seed: int = 0) -> list[Task]:
    """The shipped task set: ``n`` questions (seed ``seed``), cached next to this Python's corpus."""
    path = stdlib_cache() / f"tasks-g{GENERATOR_VERSION}-n{n}-seed{seed}.jsonl"
    if not path.is_file():
        tmp = build_search_tasks(n, path.with_suffix(".tmp"), seed)
        tmp.replace(path)
    return load_tasks(path)


register(EnvSpec("search", SearchEnv.description, SearchEnv, {"stdlib": stdlib_tasks}))

__all__ = [
    "Doc",
    "Index",
    "SearchEnv",
    "build_search_tasks",
    "extract",
    "generate",
    "load_corpus",
    "matches",
    "shared_index",
    "stdlib_tasks",
]
