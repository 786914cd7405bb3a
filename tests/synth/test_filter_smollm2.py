"""pass@k filtering with a real target policy: SmolLM2-135M-Instruct (local, via LocalBackend) on the
shipped ``search`` task set. The fast test is a one-episode smoke run; the slow one scores several
tasks and checks every number the report gives against the episodes' own rewards."""

from __future__ import annotations

import json
from math import comb

import pytest

from dsv32.synth.backends import parse_spec
from dsv32.synth.commands import run_filter


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_smollm2_pass_at_k_smoke(tmp_path):
    policy = parse_spec("local:smollm2,max_tokens=8,temperature=1.0")
    summary = run_filter("search", "stdlib", policy, tmp_path / "f", limit=1, k=1, max_steps=1, seed=0)
    (row,) = _rows(tmp_path / "f" / "results.jsonl")
    stops = ({"answer": 1}, {"max_steps": 1}, {"length": 1})  # 8 tokens may cut the reply
    assert row["stats"]["n"] == 1 and row["stats"]["stop_reasons"] in stops
    assert row["usage"]["roles"]["policy"]["prompt_tokens"] > 100 and row["usage"]["cost_usd"] == 0.0
    assert summary["distribution"]["tasks"] == 1
    assert summary["provenance"]["generators"] == {"policy": "local:smollm2"}
    assert (tmp_path / "f" / "report.md").read_text().startswith("# pass@1 filter: search / local:smollm2")


@pytest.mark.slow
def test_smollm2_pass_at_k_filter_run(tmp_path):
    policy = parse_spec("local:smollm2,max_tokens=48,temperature=1.0")
    k, n = 2, 4
    summary = run_filter("search", "stdlib", policy, tmp_path / "f", limit=3, k=k, n=n, max_steps=2, seed=0)
    rows = _rows(tmp_path / "f" / "results.jsonl")
    assert len(rows) == 3
    kept = (
        {t["id"] for t in _rows(tmp_path / "f" / "tasks.jsonl")}
        if (tmp_path / "f" / "tasks.jsonl").exists()
        else set()
    )
    for row in rows:
        s = row["stats"]
        c = sum(r == 1.0 for r in s["rewards"])
        assert s["n"] == n and s["c"] == c
        assert s[f"pass@{k}"] == pytest.approx(1 - comb(n - c, k) / comb(n, k))
        assert (s["task"] in kept) == (c > 0)
    assert summary["distribution"]["never_solved"] == sum(r["stats"]["c"] == 0 for r in rows)
