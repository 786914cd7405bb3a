"""A NaN/inf loss or gradient in a DSA stage never reaches the weights, AdamW's moments or a checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("transformers")

from helpers.train import TINY_DSA, token_data

import dsv32.train.dsa.trainer as trainer
from dsv32.train import ModelSpec, StageConfig, load_dsa_model, train_stage
from dsv32.train.dsa.config import TrainConfigError, load_run_config
from dsv32.training_guard import NonFiniteUpdateError


def inf_grads(dm, steps: set[int] | None, name: str) -> None:
    """Make the gradient of parameter ``name`` inf in the backward of the given steps (1-based; None:
    all) — what an fp overflow does."""
    param = dict(dm.model.named_parameters())[name]
    calls = [0]

    def hook(grad):
        calls[0] += 1
        return grad * float("inf") if steps is None or calls[0] in steps else grad

    param.register_hook(hook)


def stage(name: str, **over) -> StageConfig:
    kw = dict(stage=name, steps=4, batch_size=2, lr=1e-3, save_every=1, keep_checkpoints=10)
    if name == "sparse":
        kw["index_topk"] = 8
    return StageConfig(**(kw | over))


def weights(out, step):
    return load_file(str(out / "checkpoints" / f"step_{step:06d}" / "weights.safetensors"))


def lines(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "name, param",
    [
        ("warmup", "model.layers.0.self_attn.indexer.wk.weight"),
        ("sparse", "model.layers.0.mlp.down_proj.weight"),
    ],
)
def test_a_non_finite_gradient_skips_its_step_and_is_counted(tmp_path, name, param):
    dm = load_dsa_model(ModelSpec(name="tiny-llama"), TINY_DSA)
    inf_grads(dm, {2}, param)
    result = train_stage(dm, token_data(), stage(name), tmp_path, progress=False)
    assert [m["skipped_updates"] for m in result.metrics] == [0, 1, 0, 0]
    assert [m["skipped_updates"] for m in lines(tmp_path)] == [0, 1, 0, 0]
    before, skipped, after = weights(tmp_path, 1), weights(tmp_path, 2), weights(tmp_path, 3)
    assert all(torch.equal(before[k], skipped[k]) for k in before)  # the skipped step changed nothing
    assert any(not torch.equal(skipped[k], after[k]) for k in before)  # the next one trained again
    assert all(bool(torch.isfinite(p).all()) for p in dm.model.parameters())
    assert all(bool(torch.isfinite(t).all()) for t in weights(tmp_path, 4).values())


def test_non_finite_steps_in_a_row_stop_the_stage_with_the_weights_untouched(tmp_path):
    dm = load_dsa_model(ModelSpec(name="tiny-llama"), TINY_DSA)
    inf_grads(dm, None, "model.layers.0.self_attn.indexer.wq_b.weight")
    before = {k: v.clone() for k, v in dm.model.state_dict().items()}
    cfg = stage("warmup", steps=5, max_skipped_updates=3, save_every=0, log_every=5)
    with pytest.raises(NonFiniteUpdateError, match=r"3 optimizer steps in a row.*lower warmup\.lr"):
        train_stage(dm, token_data(), cfg, tmp_path, progress=False)
    after = dm.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert [(m["step"], m["skipped_updates"]) for m in lines(tmp_path)] == [(1, 1), (2, 1)]  # logged
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "model").exists()


def test_no_checkpoint_or_model_is_written_from_non_finite_weights(tmp_path, monkeypatch):
    real, calls = trainer._online_micro, [0]

    def micro(dm, *args):
        out = real(dm, *args)
        calls[0] += 1
        if calls[0] == 2:  # weights broken by something other than an update (finite loss and grads)
            with torch.no_grad():
                next(dm.model.parameters()).view(-1)[0] = float("nan")
        return out

    monkeypatch.setattr(trainer, "_online_micro", micro)
    dm = load_dsa_model(ModelSpec(name="tiny-llama"), TINY_DSA)
    with pytest.raises(NonFiniteUpdateError, match=r"after step 2 .* no checkpoint or model is written"):
        train_stage(dm, token_data(), stage("sparse"), tmp_path, progress=False)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000001"]
    assert not (tmp_path / "model").exists()


def test_a_streak_of_skipped_steps_survives_a_resume(tmp_path):
    cfg = stage("warmup", steps=6, max_skipped_updates=3)
    param = "model.layers.0.self_attn.indexer.wk.weight"
    dm = load_dsa_model(ModelSpec(name="tiny-llama"), TINY_DSA)
    inf_grads(dm, None, param)
    train_stage(dm, token_data(), cfg, tmp_path, progress=False, stop_after=2)  # killed after step 2
    state = json.loads((tmp_path / "checkpoints" / "step_000002" / "state.json").read_text())
    assert state["skipped_streak"] == 2
    dm = load_dsa_model(ModelSpec(name="tiny-llama"), TINY_DSA)
    inf_grads(dm, None, param)
    with pytest.raises(NonFiniteUpdateError, match="3 optimizer steps in a row"):
        train_stage(dm, token_data(), cfg, tmp_path, progress=False)  # the streak goes on: step 3
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000001", "step_000002"]


def test_max_skipped_updates_is_checked_and_may_change_on_resume(tmp_path):
    with pytest.raises(TrainConfigError, match="max_skipped_updates = 0: must be >= 1"):
        load_run_config(None, ["sparse.max_skipped_updates=0"])
    assert load_run_config(None).warmup.max_skipped_updates == 3
    data = token_data()
    train_stage(load_dsa_model(ModelSpec(name="tiny-llama"), TINY_DSA), data, stage("warmup"), tmp_path,
                progress=False, stop_after=2)  # fmt: skip
    resumed = train_stage(
        load_dsa_model(ModelSpec(name="tiny-llama"), TINY_DSA), data, stage("warmup", max_skipped_updates=7),
        tmp_path, progress=False,
    )  # fmt: skip
    assert [m["step"] for m in resumed.metrics] == [3, 4]
