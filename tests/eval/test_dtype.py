"""A local model's dtype in ``dsv32 eval``: the setting, its errors, ``auto`` resolved to what the
machine runs, the run directory's identity, and the CLI flag end to end on a tiny V3.2 checkpoint."""

from __future__ import annotations

import json

import pytest
from helpers import v32_model as V

from dsv32.cli import main
from dsv32.engine import dtype as D
from dsv32.eval import RunSettings
from dsv32.eval.errors import EvalError


def test_the_dtype_setting_and_its_errors(monkeypatch):
    assert RunSettings("humaneval", backend="local").dtype == "float32"  # the library default
    with pytest.raises(EvalError, match="must be one of"):
        RunSettings("humaneval", backend="local", dtype="fp16")
    with pytest.raises(EvalError, match="is for a local model"):
        RunSettings("humaneval", backend="openai", model="m", base_url="http://x/v1", dtype="bfloat16")
    for fast, want in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(D, "cpu_has_fast_bf16", lambda fast=fast: fast)
        monkeypatch.setattr("torch.cuda.is_available", lambda: False)
        assert RunSettings("humaneval", backend="local", dtype="auto").dtype == want


def test_the_identity_names_the_dtype_only_when_it_is_not_float32():
    """A run directory written before the setting existed (fp32) still resumes; bf16 and fp32 samples
    never mix in one directory."""
    assert "dtype" not in RunSettings("humaneval", backend="local").identity()
    assert RunSettings("humaneval", backend="local", dtype="bfloat16").identity()["dtype"] == "bfloat16"


def test_dsv32_eval_runs_a_local_model_in_bf16_and_refuses_to_resume_it_in_fp32(tmp_path, capsys):
    ckpt = V.save_plain(tmp_path / "ckpt")
    args = ["eval", "run", "humaneval", "--backend", "local", str(ckpt), "--limit", "1", "--max-tokens", "3",
            "--temperature", "0", "--out", str(tmp_path / "run"), "--no-progress"]  # fmt: skip
    assert main([*args, "--dtype", "bfloat16"]) == 0
    saved = json.loads((tmp_path / "run" / "settings.json").read_text())
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["dtype"] == results["settings"]["dtype"] == "bfloat16"
    assert main([*args, "--dtype", "float32"]) != 0
    assert "dtype 'bfloat16' -> None" in capsys.readouterr().err
    assert main(["eval", "run", "humaneval", "--dtype", "bfloat16", "--limit", "1"]) != 0  # reference
    assert "is for a local model" in capsys.readouterr().err
