"""Programmatic environments on disk: bundles in the LLM loop's format (the loop's own harness reads
their tools and runs their solutions), byte-identical by seed, verifiers that refuse idle, constant and
spraying answers, a sample played in the sandbox, the split files, the cache, and the RL recipe's
``[[envs]]`` reading a written set through ``synth-general``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dsv32.envs.base import Episode, Task, get_env, load_tasks, replay, resolve_tasks
from dsv32.envs.general import SynthGeneralEnv, load_bundle
from dsv32.envs.general import runner as general_runner
from dsv32.synth import harness
from dsv32.synth.programmatic import (
    cached_set,
    card_of_bundle,
    draw_environments,
    generate,
    sandbox_check,
    split_domains,
    split_environments,
)
from dsv32.synth.programmatic.bundles import BUNDLE_FILES
from dsv32.synth.programmatic.tasks import CONSTANT_ANSWERS
from dsv32.synth.records import SynthError
from dsv32.synth.versions import IDLE_ANSWERS, solution_problems

N = 10


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV32_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("envs") / "set"
    manifest = generate(out, N, seed=0)
    return out, manifest, [json.loads(line) for line in (out / "tasks.jsonl").read_text().splitlines()]


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _scratch(bundle: Path, tmp_path: Path) -> Path:
    """A copy of the bundle to run code from (loading it may write bytecode beside it)."""
    copy = tmp_path / bundle.name
    shutil.copytree(bundle, copy)
    return copy


def test_bundles_are_the_loops_format_and_the_loops_harness_reads_them(written, tmp_path):
    out, manifest, rows = written
    assert manifest["counts"]["environments"] == N and len(rows) == 2 * N
    for row in rows:
        bundle = Path(row["info"]["bundle"])
        assert bundle.is_absolute() and bundle.parent == out.absolute() / "bundles"
        assert sorted(p.name for p in bundle.iterdir()) == sorted(BUNDLE_FILES)
        loaded = load_bundle(bundle)
        task = loaded.task
        assert set(task) == {"id", "prompt", "category", "difficulty", "reference", "provenance"}
        assert task["id"] == row["id"] and task["category"] == row["domain"]
        calls = task["reference"]["calls"]
        assert 2 <= len(calls) <= 4 and task["difficulty"] == len(calls)
        code = _scratch(bundle, tmp_path)
        assert harness.schema(str(code))["tools"] == loaded.tools
        assert 3 <= len(loaded.tools) <= 8
        assert solution_problems((bundle / "solution.py").read_text()) == []
        run = tmp_path / f"{bundle.name}.sqlite"
        shutil.copyfile(bundle / "db.sqlite", run)
        solved = harness.solve(str(code), str(run))
        assert (
            solved["calls"] == task["reference"]["calls"] and solved["answer"] == task["reference"]["answer"]
        )


def test_the_same_seed_gives_byte_identical_bundles_and_manifest(written, tmp_path):
    out, manifest, rows = written
    again = tmp_path / "again"
    assert generate(again, N, seed=0) == manifest
    assert _files(again / "bundles") == _files(out / "bundles")
    assert (again / "manifest.json").read_bytes() == (out / "manifest.json").read_bytes()
    moved = (again / "tasks.jsonl").read_text().replace(str(again.absolute()), str(out.absolute()))
    assert moved == (out / "tasks.jsonl").read_text()
    other = generate(tmp_path / "other", N, seed=1)
    assert {e["signature"] for e in other["environments"]}.isdisjoint(
        {e["signature"] for e in manifest["environments"]}
    )


def test_verifiers_refuse_idle_constant_and_spraying_answers(written, tmp_path):
    _, _, rows = written
    draws = {f"{e.id}-t{j}": (e, t) for e in draw_environments(N, seed=0) for j, t in enumerate(e.tasks)}
    for row in rows:
        env, draw = draws[row["id"]]
        code = _scratch(Path(row["info"]["bundle"]), tmp_path)
        initial, final = code / "db.sqlite", tmp_path / f"{code.name}-work.sqlite"
        checked = general_runner.check(str(code), str(final))  # leaves the reference's final state
        assert checked["failed_calls"] == [] and checked["reference"]["passed"], checked
        assert not checked["empty_answer"]["passed"]
        answer = json.loads((code / "task.json").read_text())["reference"]["answer"]

        def passes(db: Path, text: str, code: Path = code, initial: Path = initial) -> bool:
            out = general_runner.verify(str(code), str(initial), str(db), json.dumps(text))
            assert out["ok"], out
            return out["passed"]

        assert passes(final, answer)
        for idle in {*IDLE_ANSWERS, *CONSTANT_ANSWERS}:
            assert not passes(initial, idle), (row["id"], idle)
        if draw.change is not None:
            assert not passes(initial, answer), row["id"]  # the no-op with the right answer
        if draw.answer["kind"] == "choice":
            table = next(t for t in env.world.tables.values() if t.name == draw.answer["table"])
            role = next(r for r, c in table.columns.items() if c == draw.answer["column"])
            values = sorted({str(r[role]) for r in table.rows})
            if len(values) > 1:
                assert not passes(final, ", ".join(values)), row["id"]  # every candidate at once
        else:
            assert not passes(final, f"{answer} or {float(answer) + 1:g}"), row["id"]
            assert not passes(final, " ".join(str(k) for k in range(2000))), row["id"]


def test_a_sample_plays_in_the_sandbox_as_the_loop_keeps_a_version(written):
    _, _, rows = written
    results = sandbox_check(rows, 6, seed=0)
    assert len(results) == 6 and all(r["ok"] for r in results), results


def test_train_and_heldout_files_split_by_domain_without_leaks(written):
    out, manifest, rows = written
    train, heldout = load_tasks(out / "train.jsonl"), load_tasks(out / "heldout.jsonl")
    assert sorted(t.id for t in [*train, *heldout]) == sorted(r["id"] for r in rows)
    split = split_domains(manifest["split"]["train"] + manifest["split"]["heldout"],
                          heldout=manifest["split"]["heldout"])  # fmt: skip
    assert {t.domain for t in train} <= set(split.train) and {t.domain for t in heldout} <= set(split.heldout)
    cards = [card_of_bundle(r["info"]["bundle"]) for r in rows]
    assert {c.id for c in cards} == {e["id"] for e in manifest["environments"]}
    split_environments(cards, split)


def test_an_output_directory_of_something_else_is_refused(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(SynthError, match="did not write"):
        generate(mine, 2, seed=0)
    assert (mine / "notes.txt").read_text() == "keep me"


def test_a_cached_set_is_written_once_and_reused(tmp_path):
    first = cached_set(3, seed=4)
    assert str(first).startswith(str(tmp_path / "cache")) and (first / "manifest.json").is_file()
    stamp = (first / "manifest.json").stat().st_mtime_ns
    assert cached_set(3, seed=4) == first and (first / "manifest.json").stat().st_mtime_ns == stamp
    assert cached_set(3, seed=4, heldout=["zoo"]) != first


def test_the_rl_recipe_plays_a_written_set_through_synth_general(written):
    from dsv32.rl.agentic.config import agentic_config_from_dict
    from dsv32.rl.grpo.config import RLConfigError

    out, manifest, _ = written
    source = {"name": "synth-general", "tasks": str(out / "train.jsonl"), "eval_tasks": str(out / "heldout.jsonl"),
              "options": {"call_timeout_s": 15}}  # fmt: skip
    cfg = agentic_config_from_dict({"envs": [source]})
    assert get_env("synth-general").factory is SynthGeneralEnv
    with pytest.raises(RLConfigError, match="does not take"):
        agentic_config_from_dict({"envs": [{**source, "options": {"bundles": str(out)}}]})
    (env_source,) = cfg.envs
    train = resolve_tasks(env_source.name, env_source.tasks)
    heldout = resolve_tasks(env_source.name, env_source.eval_tasks)
    assert {t.domain for t in train} <= set(manifest["split"]["train"]) and train
    assert {t.domain for t in heldout} <= set(manifest["split"]["heldout"])
    with get_env(env_source.name).factory(**env_source.options) as env:
        task = train[0]
        assert env.name == "synth-general"
        assert env.reward(replay(env, task, env.reference(task))).value == 1.0
        env.reset(Task.from_dict(task.to_dict()))
        assert env.reward(Episode([], "I could not complete the task.")).value == 0.0
