"""bf16 mixed precision in training: ``[policy] dtype`` (GRPO's training forwards) and ``[model] dtype``
(SFT) run the forward under autocast over fp32 weights — matmuls in bf16, log-probs and the loss in
fp32, gradients and optimizer state fp32 — and held-out evaluations sample in the rollouts' dtype."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from helpers.rl import LETTER_TASKS, LetterReward, letter_recipe

from dsv32.rl.grpo.config import RLConfigError, load_rl_config
from dsv32.rl.grpo.policy import load_policy, sampling_policy, with_precision
from dsv32.rl.grpo.rollout import SamplingConfig, rollout
from dsv32.rl.grpo.single_turn import SingleTurnTrainer
from dsv32.train.sft import SFTConfigError, load_sft_config, loss_sum, train_sft
from dsv32.train.sft.data import collate, encode_example, make_rows
from dsv32.train.sft.model import prepare_sft_model

#: bf16 matmuls against fp32, per token log-prob (8 significant bits); on the tiny V3.2 a bf16 score
#: now and then flips one of the indexer's top-k selections or an expert choice (as bf16 sampling
#: does, tests/rl/test_bf16_engine.py), moving that token's log-prob further
BF16_LOGPROB = {"tiny-llama": 0.02, "tiny-native": 0.3}


def _linear_output_dtypes(model: torch.nn.Module):
    """Record the output dtype of every ``nn.Linear`` call; returns (list, handles)."""
    seen, handles = [], []
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            handles.append(m.register_forward_hook(lambda _m, _a, out: seen.append(out.dtype)))
    return seen, handles


def test_the_recipes_take_a_training_dtype_and_refuse_others(tmp_path):
    assert load_rl_config(None, []).policy.dtype == "float32"  # fp32 numerics stay the default
    assert load_rl_config(None, ["policy.dtype=bfloat16"]).policy.dtype == "bfloat16"
    with pytest.raises(RLConfigError, match="must be one of 'float32', 'bfloat16', 'auto'"):
        load_rl_config(None, ["policy.dtype=float16"])
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps(_conversation(1)) + "\n")
    path = f'data.path="{data}"'
    assert load_sft_config(None, [path]).model.dtype == "float32"
    assert load_sft_config(None, [path, 'model.dtype="bfloat16"']).model.dtype == "bfloat16"
    with pytest.raises(SFTConfigError, match="must be one of 'float32', 'bfloat16', 'auto'"):
        load_sft_config(None, [path, 'model.dtype="half"'])


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-native"])
def test_a_bf16_training_forward_runs_its_matmuls_in_bf16_and_its_gradients_in_fp32(name):
    policy = load_policy(name, device="cpu")
    assert with_precision(policy, "float32").autocast is None
    mixed = with_precision(policy, "bfloat16")
    assert mixed.autocast is torch.bfloat16 and mixed.model is policy.model  # shared, not copied
    params = SamplingConfig(temperature=1.0, max_new_tokens=24)  # past the tiny V3.2's top-k: sparse
    batch = rollout(policy, LETTER_TASKS, 2, params, generator=torch.Generator().manual_seed(0))
    rows = batch.rows(torch.arange(len(batch)))
    with torch.no_grad():
        full = policy.action_logprobs(**rows)
    seen, handles = _linear_output_dtypes(policy.model)
    try:
        half = mixed.action_logprobs(**rows)
    finally:
        for h in handles:
            h.remove()
    assert seen and set(seen) == {torch.bfloat16}
    assert half.dtype is torch.float32
    mask = batch.action_mask
    diff = (half.detach() - full)[mask].abs()
    assert 0 < float(diff.max()) < BF16_LOGPROB[name]  # bf16 arithmetic, close to fp32's
    with torch.no_grad():  # the reference's and a recomputed π_old's forward: the model's inference path
        reference = mixed.action_logprobs(**rows)
    assert (
        reference.dtype is torch.float32 and float((reference - full)[mask].abs().max()) < BF16_LOGPROB[name]
    )
    half[mask].sum().backward()
    grads = [p.grad for p in policy.model.parameters() if p.grad is not None]
    assert grads and all(g.dtype is torch.float32 and torch.isfinite(g).all() for g in grads)
    assert all(p.dtype is torch.float32 for p in policy.model.parameters())


def test_a_grpo_step_in_bf16_keeps_fp32_weights_and_optimizer_state_and_stays_near_on_policy(tmp_path):
    cfg = letter_recipe(tmp_path, **{"grpo.steps": 1, "policy.dtype": "bfloat16", "engine.dtype": "bfloat16"})
    trainer = SingleTurnTrainer(cfg, reward_fn=LetterReward(), progress=False)
    assert trainer.policy.autocast is torch.bfloat16
    before = {k: v.detach().clone() for k, v in trainer.policy.model.named_parameters()}
    result = trainer.fit()
    m = result.metrics[0]
    assert 0 < m["first_update_abs_log_ratio"] < BF16_LOGPROB["tiny-llama"]  # bf16 sampling and training
    after = dict(trainer.policy.model.named_parameters())
    assert all(p.dtype is torch.float32 for p in after.values())
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it trained
    state = [s for s in trainer.optimizer.state.values() if "exp_avg" in s]
    assert state and all(s["exp_avg"].dtype is torch.float32 for s in state)


def test_held_out_evaluations_sample_with_the_rollouts_bf16_copy_of_the_current_weights(tmp_path):
    cfg = letter_recipe(tmp_path, **{"engine.dtype": "bfloat16"})
    trainer = SingleTurnTrainer(cfg, reward_fn=LetterReward(), progress=False)
    with torch.no_grad():  # as if an update had moved the trainer's weights
        for p in trainer.policy.model.parameters():
            p.mul_(1.05)
    evaluator = trainer.evaluation_policy(3)
    assert evaluator.model is trainer.engine.model and trainer.engine.weight_version() == 3
    theirs = dict(trainer.sampler.model.named_parameters())
    for name, p in evaluator.model.named_parameters():
        assert p.dtype is torch.bfloat16 and torch.equal(p, theirs[name].detach().to(torch.bfloat16)), name
    fp32 = SingleTurnTrainer(letter_recipe(tmp_path / "b"), reward_fn=LetterReward(), progress=False)
    assert fp32.evaluation_policy(0) is fp32.sampler


def test_an_evaluation_outside_the_trainer_samples_from_a_bf16_copy_of_the_weights_of_the_moment():
    policy = load_policy("tiny-llama", device="cpu")
    assert sampling_policy(policy, "float32") is policy
    copy = sampling_policy(policy, "bfloat16")
    assert copy.model is not policy.model and copy.tokenizer is policy.tokenizer
    theirs = dict(policy.model.named_parameters())
    for name, p in copy.model.named_parameters():
        assert p.dtype is torch.bfloat16 and not p.requires_grad
        assert torch.equal(p, theirs[name].detach().to(torch.bfloat16)), name


# ------------------------------------------------------------------------------------------- SFT
def _conversation(a: int) -> dict:
    return {
        "messages": [
            {"role": "user", "content": f"{a}+{a}?"},
            {"role": "assistant", "content": str(2 * a), "reasoning_content": "add"},
        ]
    }


def test_sft_in_bf16_computes_its_loss_close_to_fp32_and_trains_fp32_weights(tmp_path):
    sm = prepare_sft_model("tiny-llama", "cpu")
    examples = [encode_example(sm.tokenizer, _conversation(a), "thinking", "all") for a in range(3, 7)]
    rows = make_rows(examples, 256, False)
    batch = collate(examples, rows, sm.pad_id)
    with torch.no_grad():
        full, n = loss_sum(sm, batch, False)
        half, m = loss_sum(sm, batch, False, torch.bfloat16)
    assert n == m and half.dtype is torch.float32
    assert 0 < abs(float(half) - float(full)) < 0.01 * float(full)
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(_conversation(a)) + "\n" for a in range(3, 11)))
    sets = {
        "model.name": "tiny-llama", "model.device": "cpu", "model.dtype": "bfloat16",
        "data.path": str(data), "data.seq_len": 256, "train.batch_size": 2, "train.lr": 3e-3,
        "train.steps": 3, "out_dir": str(tmp_path / "run"),
    }  # fmt: skip
    result = train_sft(
        load_sft_config(None, [f"{k}={json.dumps(v)}" for k, v in sets.items()]), model=sm, progress=False
    )
    assert result.steps == 3 and result.metrics[-1]["loss"] < result.metrics[0]["loss"]
    assert all(p.dtype is torch.float32 for p in sm.model.parameters())
