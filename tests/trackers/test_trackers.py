"""The trackers on their own: ``report_to`` values, the scalars of a row, a missing package named at
start, and every tracker's files read back through its own reader equal to ``metrics.jsonl``."""

from __future__ import annotations

import importlib.util
import json

import pytest
from helpers import trackers as read

from dsv32.recipe import RecipeError
from dsv32.trackers import TRACKERS, TrackerError, Trackers, open_trackers, parse_report_to, require, scalars

ROWS = [
    {"step": 1, "loss": 2.5, "lr": 1e-3, "tokens": 4096, "judge": {"requests": 3, "failures": 0}},
    {"step": 2, "loss": 1.25, "lr": 2e-3, "tokens": 8192, "layer_loss": [0.1, 0.2], "stage": "warmup"},
    {"step": 3, "loss": float("nan"), "grad_norm": float("inf"), "skipped_updates": 1, "ok": True, "x": None},
]


def test_report_to_names_trackers_or_none():
    assert parse_report_to("none") == ()
    assert parse_report_to("tensorboard") == ("tensorboard",)
    assert parse_report_to(" wandb , mlflow,trackio") == ("wandb", "mlflow", "trackio")
    for bad, why in [
        ("", "empty name"),
        ("tensorbord", "unknown 'tensorbord'"),
        ("none,wandb", "cannot be combined"),
        ("wandb,wandb", "named twice"),
        ("wandb,", "empty name"),
    ]:
        with pytest.raises(TrackerError, match=why):
            parse_report_to(bad)


def test_a_missing_package_is_named_with_its_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a)
    )
    with pytest.raises(TrackerError, match=r"mlflow not installed; pip install 'dsv32\[mlflow\]'"):
        require("tensorboard,mlflow")
    assert require("none") == ()


def test_scalars_are_the_numbers_of_a_row_with_tables_flattened():
    assert scalars(ROWS[0]) == {
        "loss": 2.5,
        "lr": 1e-3,
        "tokens": 4096.0,
        "judge/requests": 3.0,
        "judge/failures": 0.0,
    }
    assert scalars(ROWS[1], "eval/") == {"eval/loss": 1.25, "eval/lr": 2e-3, "eval/tokens": 8192.0}
    third = scalars(ROWS[2])
    assert set(third) == {"loss", "grad_norm", "skipped_updates"}  # no bool, None, list or string


def test_no_trackers_in_other_ranks_or_for_none(tmp_path):
    with open_trackers("tensorboard", tmp_path, config={}, name="t", main=False) as t:
        assert t.trackers == {}
        t.append(tmp_path / "metrics.jsonl", ROWS[0])
    with open_trackers("none", tmp_path, config={}, name="t") as t:
        assert t.trackers == {}
    assert not (tmp_path / "trackers").exists()
    assert [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == ROWS[:1]


def test_a_recipe_refuses_a_bad_report_to(tmp_path):
    from dsv32.rl.grpo.config import rl_config_from_dict
    from dsv32.train.dsa.config import run_config_from_dict

    with pytest.raises(RecipeError, match=r"report_to = \"tensorflow\".*unknown 'tensorflow'"):
        rl_config_from_dict({"report_to": "tensorflow"})
    with pytest.raises(RecipeError, match="cannot be combined"):
        run_config_from_dict({"report_to": "none,tensorboard"})
    assert rl_config_from_dict({"report_to": "wandb,mlflow"}).report_to == "wandb,mlflow"


def _log_rows(tmp_path, name: str) -> None:
    config = {"grpo": {"lr": 1e-3, "steps": 3}, "out_dir": str(tmp_path), "sources": [{"kind": "jsonl"}]}
    with open_trackers(name, tmp_path, config=config, name="unit") as t:
        for row in ROWS:
            t.append(tmp_path / "metrics.jsonl", row)
        t.append(tmp_path / "eval.jsonl", {"step": 3, "accuracy": 0.5, "problems": 8}, prefix="eval/")


LOGS = {"metrics.jsonl": "", "eval.jsonl": "eval/"}


def test_tensorboard_reads_back_every_scalar(tmp_path):
    read.skip_unless_installed("tensorboard")
    _log_rows(tmp_path, "tensorboard")
    folder = tmp_path / "trackers" / "tensorboard"
    read.assert_same(read.tensorboard(folder), read.expected(tmp_path, LOGS), rel=1e-6)  # float32
    (config,) = read.tensorboard_text(folder, "config")
    assert json.loads(config)["grpo"] == {"lr": 1e-3, "steps": 3}


def test_mlflow_reads_back_every_scalar(tmp_path):
    read.skip_unless_installed("mlflow")
    _log_rows(tmp_path, "mlflow")
    series, config, params = read.mlflow(tmp_path / "trackers" / "mlflow")
    read.assert_same(series, read.expected(tmp_path, LOGS))
    assert config["grpo"] == {"lr": 1e-3, "steps": 3}
    assert params["grpo.lr"] == "0.001" and json.loads(params["sources"]) == [{"kind": "jsonl"}]


def test_wandb_reads_back_every_scalar(tmp_path, monkeypatch):
    read.skip_unless_installed("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    _log_rows(tmp_path, "wandb")
    series, config = read.wandb(tmp_path / "trackers" / "wandb")
    read.assert_same(series, read.expected(tmp_path, LOGS))
    assert config["grpo"] == {"lr": 1e-3, "steps": 3}


def test_trackio_reads_back_every_scalar(tmp_path):
    read.skip_unless_installed("trackio")
    _log_rows(tmp_path, "trackio")
    series, config = read.trackio(tmp_path / "trackers" / "trackio")
    want = read.expected(tmp_path, LOGS)
    read.assert_same(series, want)
    assert config["grpo"] == {"lr": 1e-3, "steps": 3}


def test_every_tracker_is_one_class_behind_one_interface():
    from dsv32 import trackers

    for name in TRACKERS:
        cls = trackers._CLASSES[name]
        assert all(callable(getattr(cls, m, None)) for m in ("log", "log_config", "close")), name
    assert Trackers().trackers == {}
