"""Every trainer mirrors its ``metrics.jsonl`` through the one hook, :meth:`dsv32.trackers.Trackers.append`:
tiny runs of the DSA stages, SFT and GRPO with a tracker each, read back through the tracker's own
reader; a missing tracker package stops a run before its model loads."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

pytest.importorskip("transformers")

from helpers import trackers as read
from helpers.rl import LetterReward, letter_recipe

from dsv32.cli import main
from dsv32.dsa import DSAConfig
from dsv32.rl.grpo.single_turn import train_grpo
from dsv32.trackers import TrackerError, Trackers
from dsv32.train import ModelSpec, StageConfig, TokenData, load_dsa_model, train_stage
from dsv32.train.sft import load_sft_config, train_sft

DSA = DSAConfig(index_n_heads=2, index_head_dim=16, index_topk=8)


def _dsa(tmp_path, stage: str, report_to: str, steps: int = 2):
    g = torch.Generator().manual_seed(0)
    data = TokenData.from_sequences(
        torch.randint(0, 257, (8, 32), generator=g), torch.randint(0, 257, (2, 32), generator=g)
    )
    dm = load_dsa_model(ModelSpec(name="tiny-llama"), DSA)
    cfg = StageConfig(stage=stage, steps=steps, batch_size=2, lr=1e-3, index_topk=8)
    config = {"model": {"name": "tiny-llama"}, stage: {"steps": steps}}
    train_stage(dm, data, cfg, tmp_path, progress=False, report_to=report_to, config=config, save_model=False)


def _sft(tmp_path, report_to: str):
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"{a}+{a}?"},
                {"role": "assistant", "content": str(2 * a), "reasoning_content": "add"},
            ]
        }
        for a in range(6)
    ]
    data = tmp_path / "train.jsonl"
    tmp_path.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sets = {"model.name": "tiny-llama", "model.device": "cpu", "data.path": str(data),
            "data.eval_path": str(data),
            "data.seq_len": 128, "train.batch_size": 2, "train.steps": 2, "train.eval_every": 1,
            "out_dir": str(tmp_path / "run"), "report_to": report_to}  # fmt: skip
    cfg = load_sft_config(None, [f"{k}={json.dumps(v)}" for k, v in sets.items()])
    train_sft(cfg, progress=False, save_model=False)
    return tmp_path / "run"


def test_dsa_warmup_to_mlflow(tmp_path):
    read.skip_unless_installed("mlflow")
    _dsa(tmp_path, "warmup", "mlflow")
    series, config, params = read.mlflow(tmp_path / "trackers" / "mlflow")
    read.assert_same(series, read.expected(tmp_path))
    assert {"loss_indexer", "lr", "tokens"} <= set(series) and "layer_loss" not in series
    assert (
        config == {"model": {"name": "tiny-llama"}, "warmup": {"steps": 2}} and params["warmup.steps"] == "2"
    )


def test_dsa_sparse_stage_to_trackio(tmp_path):
    read.skip_unless_installed("trackio")
    _dsa(tmp_path, "sparse", "trackio")
    series, config = read.trackio(tmp_path / "trackers" / "trackio")
    read.assert_same(series, read.expected(tmp_path))
    assert {"loss_lm", "lr_indexer", "grad_norm_model"} <= set(series)
    assert config["sparse"] == {"steps": 2}


def test_sft_to_wandb(tmp_path, monkeypatch):
    read.skip_unless_installed("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    out = _sft(tmp_path, "wandb")
    series, config = read.wandb(out / "trackers" / "wandb")
    read.assert_same(series, read.expected(out))
    assert "eval_loss" in series and config["train"]["steps"] == 2 and config["report_to"] == "wandb"


def test_grpo_to_tensorboard_with_held_out_results_and_a_resume(tmp_path):
    """Killed after step 4 with the checkpoint at step 2: the resumed launch purges the first one's
    steps 3–4, so TensorBoard holds exactly the rows of ``metrics.jsonl`` and ``eval.jsonl``."""
    read.skip_unless_installed("tensorboard")
    from dsv32.rl.grpo.config import SourceConfig

    over = {"grpo.steps": 4, "save_every": 2, "eval.every": 1, "eval.problems": 2, "eval.max_new_tokens": 4,
            "report_to": "tensorboard"}  # fmt: skip
    cfg = letter_recipe(tmp_path, **over)
    cfg.sources.append(SourceConfig(kind="arithmetic", max_operand=9, weight=0.5))

    def killed(record):
        if record["step"] == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_grpo(cfg, reward_fn=LetterReward(), progress=False, on_step=killed)
    train_grpo(cfg, reward_fn=LetterReward(), progress=False)
    out = tmp_path / "run"
    folder = out / "trackers" / "tensorboard"
    assert len(list(folder.glob("events.out.tfevents.*"))) == 2  # one file per launch
    want = read.expected(out, {"metrics.jsonl": "", "eval.jsonl": "eval/"})
    read.assert_same(read.tensorboard(folder), want, rel=1e-6)
    assert {"reward_mean", "kl", "eval/accuracy"} <= set(want)
    configs = [json.loads(text) for text in read.tensorboard_text(folder, "config")]
    assert len(configs) == 2 and all(c["grpo"]["steps"] == 4 for c in configs)


def test_the_dsa_and_grpo_trainers_write_metrics_through_the_same_hook(tmp_path, monkeypatch):
    calls = []
    real = Trackers.append

    def spy(self, path, record, prefix=""):
        calls.append((path, json.loads(json.dumps(record))))
        real(self, path, record, prefix)

    monkeypatch.setattr(Trackers, "append", spy)
    _dsa(tmp_path / "dsa", "warmup", "none")
    train_grpo(letter_recipe(tmp_path / "rl", **{"grpo.steps": 2}), reward_fn=LetterReward(), progress=False)
    for out in (tmp_path / "dsa", tmp_path / "rl" / "run"):
        path = out / "metrics.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(rows) == 2 and [r for p, r in calls if p == path] == rows, out


@pytest.fixture
def no_tensorboard(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a)
    )


def _no_model(*args, **kwargs):
    raise AssertionError("a model loaded before the trackers were checked")


def test_a_missing_tracker_stops_every_trainer_before_its_model_loads(tmp_path, monkeypatch, no_tensorboard):
    from dsv32.train.dsa import pipeline
    from dsv32.train.dsa.config import RunConfig
    from dsv32.train.sft import trainer as sft_trainer

    monkeypatch.setattr(pipeline, "load_dsa_model", _no_model)
    monkeypatch.setattr(sft_trainer, "prepare_sft_model", _no_model)
    monkeypatch.setattr("dsv32.rl.grpo.single_turn.load_policy", _no_model)
    with pytest.raises(TrackerError, match=r"tensorboard not installed; pip install 'dsv32\[tensorboard\]'"):
        pipeline.run_stage(RunConfig(out_dir=str(tmp_path / "dsa"), report_to="tensorboard"), "warmup")
    with pytest.raises(TrackerError, match="tensorboard not installed"):
        pipeline.run_demo(RunConfig(out_dir=str(tmp_path / "demo"), report_to="tensorboard"))
    with pytest.raises(TrackerError, match="tensorboard not installed"):
        _sft(tmp_path / "sft", "tensorboard")
    with pytest.raises(TrackerError, match="tensorboard not installed"):
        train_grpo(letter_recipe(tmp_path / "rl", report_to="tensorboard"), reward_fn=LetterReward())
    assert not any((tmp_path / d).exists() for d in ("dsa", "demo", "sft/run", "rl/run"))


def test_the_training_commands_take_report_to(tmp_path, capsys, no_tensorboard):
    commands = [["dsa", "warmup"], ["dsa", "sparse"], ["demo"], ["sft"], ["rl", "train"], ["posttrain", "rl"]]
    for command in [*commands, ["posttrain", "proof"]]:
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        assert "--report-to" in capsys.readouterr().out, command
    code = main(
        ["rl", "train", "--policy", "tiny-llama", "--out", str(tmp_path / "rl"), "--report-to", "tensorboard"]
    )
    assert code == 2
    assert "pip install 'dsv32[tensorboard]'" in capsys.readouterr().err
    assert main(["sft", "--report-to", "tensorbord", "--data", __file__, "--out", str(tmp_path / "sft")]) == 2
    assert "unknown 'tensorbord'" in capsys.readouterr().err


def test_the_post_training_proof_mirrors_both_stages_and_its_run_has_a_page(tmp_path, capsys):
    read.skip_unless_installed("tensorboard")
    sets = ["sft.model.name=tiny-llama", "sft.train.freeze_layers=0", "sft.data.seq_len=1024",
            "sft.train.epochs=1", "tasks.train=2", "tasks.heldout=2", "rl.grpo.steps=2",
            "rl.grpo.prompts_per_step=1", "rl.eval.every=1",
            "rl.grpo.group_size=2", "rl.grpo.mini_batches=1", "rl.sampling.max_new_tokens=16"]  # fmt: skip
    argv = ["posttrain", "proof", "--out", str(tmp_path / "p"), "--no-progress", "--report-to", "tensorboard"]
    assert main([*argv, *[a for s in sets for a in ("--set", s)]]) == 0
    for stage, logs in (("sft", None), ("rl", {"metrics.jsonl": "", "eval.jsonl": "eval/"})):
        out = tmp_path / "p" / stage
        want = read.expected(out, logs)
        read.assert_same(read.tensorboard(out / "trackers" / "tensorboard"), want, rel=1e-6)
    assert "eval/accuracy" in want
    from dsv32.view import render  # the run this proof wrote, as dsv32 view shows it

    html = render(tmp_path / "p")
    assert html.count('<tr class="sample"') == 2 and html.count("data:image/png;base64,") == 3
    assert "SFT loss" in html and "GRPO reward" in html and "held-out during GRPO" in html


def test_posttrain_rl_checks_its_tracker_before_the_policy_loads(tmp_path, capsys, no_tensorboard):
    code = main(["posttrain", "rl", "--out", str(tmp_path / "rl"), "--report-to", "tensorboard"])
    assert code == 2 and "pip install 'dsv32[tensorboard]'" in capsys.readouterr().err
    assert not (tmp_path / "rl").exists()
    code = main(["posttrain", "proof", "--out", str(tmp_path / "p"), "--report-to", "tensorboard"])
    assert code == 2 and "tensorboard not installed" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()
