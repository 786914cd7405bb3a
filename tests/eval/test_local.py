"""The local backend with the real SmolLM2-135M-Instruct: batched single-turn generation and
agentic episodes through dsv32.agent's LocalBackend."""

from __future__ import annotations

import json

import pytest

from dsv32.eval import RunSettings, run
from dsv32.eval.solvers import LocalSolver


@pytest.fixture(scope="module")
def smollm2():
    return LocalSolver("smollm2", batch_size=2)


def test_smollm2_answers_humaneval_in_a_batch(tmp_path, smollm2):
    settings = RunSettings("humaneval", backend="local", model="smollm2", temperature=0, max_tokens=8, limit=2,
                           batch_size=2)  # fmt: skip
    results = run(settings, tmp_path / "he", solver=smollm2, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "he" / "samples.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == ["HumanEval/0", "HumanEval/1"]  # written as each is scored
    for row in rows:
        assert row["completion"]["content"].strip()
        assert 1 <= row["completion_tokens"] <= 8 and row["finish_reason"] in ("stop", "length")
        assert row["score"] in (0.0, 1.0) and row["reason"]
    assert results["model"]["name"] == "smollm2" and results["problems"] == 2


@pytest.mark.slow
def test_smollm2_sampled_bfcl_and_multi_turn_episodes(tmp_path, smollm2):
    bfcl = run(RunSettings("bfcl", backend="local", model="smollm2", subset=["simple_python"], limit=4, n=2,
                           max_tokens=96, batch_size=4), tmp_path / "b", solver=smollm2, progress=False)  # fmt: skip
    assert bfcl["samples"] == 8
    mt = run(RunSettings("bfcl-multi-turn", backend="local", model="smollm2", limit=1, max_tokens=64, max_steps=4),
             tmp_path / "mt", solver=smollm2, progress=False)  # fmt: skip
    row = json.loads((tmp_path / "mt" / "samples.jsonl").read_text().splitlines()[0])
    assert row["steps"] >= 1 and row["reason"]
    assert mt["agentic"]["steps_mean"] >= 1
