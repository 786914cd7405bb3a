"""``dsv32 synth envs``: draw ``n`` environments, write and check their bundles, split them by domain.

    OUT/manifest.json   the settings, the domain split and one entry per environment (domain, side of
                        the split, toolset signature, tables, tools, task ids)
    OUT/tasks.jsonl     every task row (``info.bundle``: the bundle's absolute path, as the loop writes)
    OUT/train.jsonl     the rows of training domains; OUT/heldout.jsonl those of held-out domains
    OUT/bundles/<id>/   one ``general-tools`` bundle per task (see :mod:`.bundles`)

The same seed and settings give byte-identical bundles and manifest. A run writes a temporary
sibling of ``OUT`` and renames it into place, so ``OUT`` is never half-written; it replaces only a
directory that an earlier run of this command wrote (one holding this generator's manifest).
:func:`cached_set` keeps sets under ``dsv32.paths.cache_dir("synth", "envs")``, keyed by the settings
and a digest of this generator's code, as the shipped ``general-tools`` sets are.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import multiprocessing
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from dsv32.envs.base import Episode, Task, load_tasks, replay
from dsv32.envs.general.env import GeneralToolEnv
from dsv32.paths import cache_dir
from dsv32.synth.programmatic.bundles import write_environment
from dsv32.synth.programmatic.domains import DOMAIN_NAMES
from dsv32.synth.programmatic.environment import Environment, draw_environments
from dsv32.synth.programmatic.split import Card, DomainSplit, split_domains, split_environments
from dsv32.synth.records import SynthError

GENERATOR = "dsv32 synth envs"
HERE = Path(__file__).parent


def code_digest() -> str:
    """A digest of the generator's code and of the runtime code its checks run."""
    from dsv32.envs.general import runner
    from dsv32.synth import harness, versions

    files = sorted([*HERE.glob("*.py"), *(HERE / "sources").glob("*.py")])
    files += [Path(m.__file__) for m in (runner, harness, versions)]
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:12]


def card_of(env: Environment) -> Card:
    tables = frozenset(t.name for t in env.world.tables.values())
    return Card(env.id, env.domain, tables, frozenset(t.name for t in env.tools))


def _owned(out: Path) -> bool:
    """Whether ``out`` is absent, empty, or an earlier output of this command."""
    if not out.exists():
        return False
    if not out.is_dir():
        raise SynthError(f"{out} exists and is not a directory")
    if not any(out.iterdir()):
        return False
    try:
        manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("generator") != GENERATOR:
        raise SynthError(
            f"{out} holds files that `{GENERATOR}` did not write; pick an empty or new --out directory"
        )
    return True


def _write_rows(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def _collect(envs: list[Environment], written: Iterable[list[dict]], split: DomainSplit, final: Path,
             progress: Callable[[str], None] | None, start: float) -> tuple[list[dict], list[dict]]:  # fmt: skip
    """The task rows (bundles named under ``final``) and manifest entries, in environment order."""
    rows, entries = [], []
    for k, (env, env_rows) in enumerate(zip(envs, written, strict=True)):
        side = split.of(env.domain)
        for row in env_rows:
            row["info"]["bundle"] = str(final / "bundles" / row["id"])
            row["info"]["split"] = side
        rows += env_rows
        entries.append({
            "id": env.id, "domain": env.domain, "split": side, "signature": env.signature_hash,
            "tables": sorted(t.name for t in env.world.tables.values()),
            "tools": sorted(t.name for t in env.tools), "tasks": [r["id"] for r in env_rows],
        })  # fmt: skip
        if progress and ((k + 1) % 100 == 0 or k + 1 == len(envs)):
            progress(
                f"{k + 1}/{len(envs)} environments written and checked ({time.perf_counter() - start:.1f} s)"
            )
    return rows, entries


def _build(tmp: Path, final: Path, envs: list[Environment], split: DomainSplit, settings: dict,
           progress: Callable[[str], None] | None, workers: int) -> dict:  # fmt: skip
    """Write every environment's bundles into ``tmp``; rows name them under ``final``."""
    provenance = {"generators": {"environment": GENERATOR}, "code_digest": code_digest(),
                  "settings": {"seed": settings["seed"], "tasks_per_env": settings["tasks_per_env"]}}  # fmt: skip
    rows, entries, start = [], [], time.perf_counter()
    write = functools.partial(write_environment, bundles=tmp / "bundles", provenance=provenance)
    with contextlib.ExitStack() as stack:
        if workers > 1:
            pool = stack.enter_context(
                ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
            )
            written = pool.map(write, envs, chunksize=8)
        else:
            written = map(write, envs)
        rows, entries = _collect(envs, written, split, final, progress, start)
    manifest = {
        "generator": GENERATOR,
        "code_digest": provenance["code_digest"],
        **settings,
        "split": {"train": list(split.train), "heldout": list(split.heldout)},
        "counts": {
            "environments": len(envs),
            "tasks": len(rows),
            "train_tasks": sum(r["info"]["split"] == "train" for r in rows),
            "heldout_tasks": sum(r["info"]["split"] == "heldout" for r in rows),
            "domains": len({e.domain for e in envs}),
            "templates": dict(sorted(Counter(r["info"]["template"] for r in rows).items())),
        },
        "environments": entries,
    }
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    _write_rows(tmp / "tasks.jsonl", rows)
    for side in ("train", "heldout"):
        _write_rows(tmp / f"{side}.jsonl", [r for r in rows if r["info"]["split"] == side])
    return manifest


def generate(
    out: str | Path,
    n: int,
    *,
    seed: int = 0,
    tasks_per_env: int = 2,
    heldout: list[str] | None = None,
    heldout_fraction: float = 0.2,
    workers: int = 1,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Write ``n`` environments of ``seed`` into ``out`` (see the module docstring); the manifest.
    ``workers`` > 1 writes and checks environments in that many processes (the result is the same)."""
    out = Path(out).absolute()
    replace = _owned(out)
    split = split_domains(DOMAIN_NAMES, heldout=heldout, fraction=heldout_fraction, seed=seed)
    envs = draw_environments(n, seed, tasks_per_env)
    split_environments([card_of(e) for e in envs], split)
    settings = {"n": n, "seed": seed, "tasks_per_env": tasks_per_env}
    if heldout is None:
        settings["heldout_fraction"] = heldout_fraction
    else:
        settings["heldout"] = sorted(set(heldout))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        manifest = _build(tmp, out, envs, split, settings, progress, workers)
        if replace:
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}-old-", dir=out.parent))
            out.rename(old / "set")
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            if out.exists():
                out.rmdir()  # empty, checked above
            tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def cached_set(n: int, seed: int = 0, tasks_per_env: int = 2, *, heldout: list[str] | None = None,
               heldout_fraction: float = 0.2, workers: int = 1,
               progress: Callable[[str], None] | None = None) -> Path:  # fmt: skip
    """The directory of a set, written into the cache on first use (keyed by its settings and the
    generator's code digest, so a changed generator never serves a stale set)."""
    settings = {"n": n, "seed": seed, "tasks_per_env": tasks_per_env, "heldout": sorted(heldout or []),
                "heldout_fraction": None if heldout else heldout_fraction}  # fmt: skip
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]
    where = cache_dir("synth", "envs", f"n{n}-seed{seed}-{key}-{code_digest()}")
    if not (where / "manifest.json").is_file():
        try:
            generate(where, n, seed=seed, tasks_per_env=tasks_per_env, heldout=heldout,
                     heldout_fraction=heldout_fraction, workers=workers, progress=progress)  # fmt: skip
        except OSError:  # another process renamed the same set into place first
            if not (where / "manifest.json").is_file():
                raise
    return where


def sandbox_check(rows: list[dict], k: int, *, seed: int = 0, isolation: str | None = None) -> list[dict]:
    """Play ``k`` of the task ``rows`` (drawn with ``seed``) in the sandbox through ``general-tools``,
    as the loop keeps a version: the reference replays with reward 1, the runtime's self-check passes
    the reference and fails the empty answer, and an idle episode scores 0. One result per task."""
    chosen = random.Random(f"synth-envs-sandbox:{seed}").sample(rows, min(k, len(rows)))
    results = []
    for row in chosen:
        task = Task.from_dict(row)
        with GeneralToolEnv(isolation=isolation) as env:
            episode = replay(env, task, env.reference(task))
            reference = env.reward(episode)
            check = env.check(task)
            env.reset(task)
            idle = env.reward(Episode([], "I could not complete the task."))
        ok = (
            reference.value == 1.0
            and not check["failed_calls"]
            and check["reference"]["passed"]
            and not check["empty_answer"]["passed"]
            and idle.value == 0.0
        )
        results.append({"id": task.id, "ok": ok, "reference": reference.value, "reason": reference.reason,
                        "empty_answer": check["empty_answer"]["passed"], "idle": idle.value})  # fmt: skip
    return results


def tasks_of(out: str | Path, split: str = "all") -> list[Task]:
    """The tasks of a written set: ``all``, ``train`` or ``heldout``."""
    name = {"all": "tasks.jsonl", "train": "train.jsonl", "heldout": "heldout.jsonl"}.get(split)
    if name is None:
        raise SynthError(f"split must be all, train or heldout, got {split!r}")
    return load_tasks(Path(out) / name)
