"""The SmolLM2 runs kept under ``runs/eval/smollm2/`` (the README's real-model rows): their samples,
graded again by today's scorers, give the scores their ``results.json`` records — so a scorer change
that would move a published number fails here, on real model output, not only on reference answers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dsv32.eval import rescore

KEPT = Path(__file__).resolve().parents[2] / "runs" / "eval" / "smollm2"
FAST = ["bfcl-greedy", "reasoning-gym-greedy"]  # graded without running programs
PROGRAMS = ["humaneval-greedy", "humaneval-n4"]  # every sample a sandboxed program: about a minute


def _graded_again(name: str, tmp_path: Path) -> tuple[dict, dict]:
    kept = KEPT / name
    if not (kept / "samples.jsonl").is_file():
        pytest.fail(f"{kept}: the kept run is missing (the README's rows read it)")
    copy = tmp_path / name
    shutil.copytree(kept, copy, ignore=shutil.ignore_patterns(".lock"))
    before = json.loads((kept / "results.json").read_text())
    return before, rescore(copy)


def _check(before: dict, after: dict) -> None:
    assert after["rescored"]["changed"] == 0
    assert after["rescored"]["samples"] == before["samples"] == before["selected"]["samples"]
    assert not after["incomplete"]
    for name, metric in before["metrics"].items():
        assert after["metrics"][name]["value"] == pytest.approx(metric["value"], abs=1e-12), name
    assert (after["date"], after["git_commit"], after["elapsed_s"]) == (
        before["date"],
        before["git_commit"],
        before["elapsed_s"],
    )


@pytest.mark.parametrize("name", FAST)
def test_kept_runs_grade_again_to_their_recorded_scores(name, tmp_path):
    _check(*_graded_again(name, tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("name", PROGRAMS)
def test_kept_humaneval_runs_grade_again_to_their_recorded_scores(name, tmp_path):
    _check(*_graded_again(name, tmp_path))


def test_the_kept_runs_are_the_readme_rows():
    rows = {name: json.loads((KEPT / name / "results.json").read_text()) for name in FAST + PROGRAMS}
    greedy = rows["humaneval-greedy"]
    assert greedy["settings"]["temperature"] == 0 and greedy["settings"]["dtype"] == "float32"
    assert greedy["problems"] == 164 and round(100 * greedy["metrics"]["pass@1"]["value"], 1) == 7.3
    sampled = rows["humaneval-n4"]
    assert sampled["settings"]["n"] == 4 and sampled["samples"] == 656
    assert rows["bfcl-greedy"]["problems"] == 1000 and rows["reasoning-gym-greedy"]["problems"] == 500
