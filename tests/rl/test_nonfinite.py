"""A NaN/inf loss or gradient never reaches the weights, the optimizer or a checkpoint."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from helpers.rl import jsonl_recipe

import dsv32.rl.grpo.update as update
from dsv32.rl.grpo.policy import load_policy
from dsv32.rl.grpo.rewards import RewardResult
from dsv32.rl.grpo.single_turn import SingleTurnTrainer, train_grpo
from dsv32.rl.grpo.update import NonFiniteUpdateError


class LengthReward:
    """Rewards vary within a group, so every update has a gradient."""

    def score_many(self, samples, max_workers=1):
        return [RewardResult(total=len(s.completion) / 40, components={}) for s in samples]


def _cfg(tmp_path, **over):
    sets = [
        "policy.name=tiny-llama",
        "policy.device=cpu",
        "grpo.prompts_per_step=2",
        "grpo.group_size=2",
        "grpo.mini_batches=2",
        "grpo.micro_batch=2",
        "grpo.lr=1e-2",
        "sampling.max_new_tokens=4",
        "eval.problems=0",
        *[f"{k}={v}" for k, v in over.items()],
    ]
    return jsonl_recipe(tmp_path, [{"prompt": p, "domain": "toy"} for p in ("ab", "xyz")], sets)


def _nan_on(monkeypatch, calls: set[int] | None):
    """Make the ``calls``-th micro-batch losses (1-based; None: all) NaN."""
    real, n = update.grpo_loss, [0]

    def loss(*args, **kwargs):
        value, metrics = real(*args, **kwargs)
        n[0] += 1
        return (value * float("nan") if calls is None or n[0] in calls else value), metrics

    monkeypatch.setattr(update, "grpo_loss", loss)


def _finite(model) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def test_a_nan_loss_skips_its_optimizer_step_and_is_counted(tmp_path, monkeypatch):
    _nan_on(monkeypatch, {3})  # the first update of step 2
    policy = load_policy("tiny-llama", device="cpu")
    result = train_grpo(
        _cfg(tmp_path, **{"grpo.steps": 3, "save_every": 1}),
        policy=policy,
        reward_fn=LengthReward(),
        progress=False,
    )
    assert [m["skipped_updates"] for m in result.metrics] == [0, 1, 0]
    assert _finite(policy.model)
    assert all(torch.isfinite(torch.tensor(m["grad_norm"])) for m in result.metrics)  # applied ones


def test_non_finite_updates_in_a_row_stop_the_run_with_the_weights_untouched(tmp_path, monkeypatch):
    _nan_on(monkeypatch, None)
    policy = load_policy("tiny-llama", device="cpu")
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    cfg = _cfg(tmp_path, **{"grpo.steps": 5, "grpo.max_skipped_updates": 3, "save_every": 1})
    with pytest.raises(NonFiniteUpdateError, match="3 optimizer steps in a row"):
        train_grpo(cfg, policy=policy, reward_fn=LengthReward(), progress=False)
    after = policy.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["skipped_updates"] for line in lines] == [2]  # step 2 raised on its first


def test_no_checkpoint_is_written_from_non_finite_weights(tmp_path):
    cfg = _cfg(tmp_path, **{"grpo.steps": 3, "save_every": 1})
    policy = load_policy("tiny-llama", device="cpu")
    trainer = SingleTurnTrainer(cfg, policy=policy, reward_fn=LengthReward(), progress=False)

    def step(step: int) -> dict:
        if step == 1:  # weights broken by something other than an update
            with torch.no_grad():
                next(trainer.policy.model.parameters()).view(-1)[0] = float("nan")
        return {"step": step + 1, "reward_mean": 0.0, "accuracy": 0.0}

    trainer.step = step
    out = tmp_path / "run"
    with pytest.raises(NonFiniteUpdateError, match="no checkpoint or model is written"):
        trainer.fit(resume=False, evaluate_before=False)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000001"]
    assert not (out / "model").exists()


def test_log_every_thins_metrics_jsonl_but_keeps_a_step_with_a_skipped_update(tmp_path, monkeypatch):
    _nan_on(monkeypatch, {3})  # the first update of step 2
    cfg = _cfg(tmp_path, **{"grpo.steps": 5, "log_every": 3})
    result = train_grpo(cfg, reward_fn=LengthReward(), progress=False)
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [2, 3, 5]
    assert [m["step"] for m in result.metrics] == [1, 2, 3, 4, 5]


def test_a_streak_of_skipped_updates_survives_a_resume(tmp_path, monkeypatch):
    _nan_on(monkeypatch, None)  # every update: two skipped per step (grpo.mini_batches=2)
    cfg = _cfg(tmp_path, **{"grpo.steps": 5, "grpo.max_skipped_updates": 4, "save_every": 1})
    train_grpo(cfg, reward_fn=LengthReward(), progress=False, stop_after=1)  # killed after step 1
    ckpt = tmp_path / "run" / "checkpoints" / "step_000001"
    assert json.loads((ckpt / "state.json").read_text())["skipped_streak"] == 2
    with pytest.raises(NonFiniteUpdateError, match="4 optimizer steps in a row"):
        train_grpo(cfg, reward_fn=LengthReward(), progress=False)  # the streak goes on: 3, 4 in step 2
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step_000001"]
