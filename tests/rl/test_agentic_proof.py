"""The post-training proof pipeline end to end on a tiny model (every stage, the report's keys), and
the report itself."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from dsv32.cli import main
from dsv32.rl.posttrain_report import STAGES, report_dict, report_markdown

KEYS = {f"{m}_{s}" for m in ("accuracy", "tool_call_valid") for s in STAGES} | {"heldout_tasks", "minutes"}


def _evals():
    return {s: {"accuracy": 0.1 * i, "tool_call_valid": 0.2 * i, "used_tool": 0.3, "mean_steps": 2.0}
            for i, s in enumerate(STAGES)}  # fmt: skip


def test_report_has_every_key_and_needs_every_stage():
    details = {"evals": _evals(), "machine": {"cpus": 2, "torch_threads": 2, "load_average_1_5_15": [1, 1, 1]},
               "model": "m", "task": "t", "load_start": [1, 1, 1], "stage_minutes": {}, "command": "c",
               "cold_start": {"kept": 3, "tasks": 4}}  # fmt: skip
    report = report_dict(_evals(), 24, 12.345, details)
    assert set(report) >= KEYS and report["minutes"] == 12.35 and report["accuracy_rl"] == pytest.approx(0.2)
    assert "| after agentic GRPO | 0.200 | 0.400 |" in report_markdown(report)
    with pytest.raises(ValueError, match="missing"):
        report_dict({"base": _evals()["base"]}, 24, 1.0, details)


def test_the_proof_pipeline_runs_every_stage_on_a_tiny_model(tmp_path, capsys):
    sets = ["sft.model.name=tiny-llama", "sft.train.freeze_layers=0", "sft.data.seq_len=1024", "sft.train.epochs=1", "tasks.train=2",
            "tasks.heldout=2", "rl.grpo.steps=1", "rl.grpo.prompts_per_step=1", "rl.grpo.group_size=2",
            "rl.grpo.mini_batches=1", "rl.sampling.max_new_tokens=16"]  # fmt: skip
    argv = ["posttrain", "proof", "--out", str(tmp_path / "p"), "--no-progress"]
    assert main([*argv, *[a for s in sets for a in ("--set", s)]]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(printed) >= KEYS and printed["heldout_tasks"] == 2
    report = json.loads((tmp_path / "p" / "report.json").read_text())
    assert report["details"]["cold_start"]["kept"] == 2
    for name in (
        "report.md",
        "report.png",
        "sft/model/tokenizer.json",
        "rl/metrics.jsonl",
        "tasks_heldout.jsonl",
    ):
        assert (tmp_path / "p" / name).exists(), name
    train = (tmp_path / "p" / "tasks_train.jsonl").read_text()
    held = [
        json.loads(line)["prompt"]
        for line in (tmp_path / "p" / "tasks_heldout.jsonl").read_text().splitlines()
    ]
    assert not any(p in train for p in held)
