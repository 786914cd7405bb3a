"""GRPO with a LoRA adapter (``[lora]``) on tiny-llama: only the adapter trains, the reference is the
base model, the first update is on-policy, step checkpoints hold the adapter alone and resume exactly,
and the final model is written merged (``model/``) and as a peft adapter (``adapter/``)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from helpers.rl import LetterReward, letter_recipe
from helpers.tolerances import ON_POLICY

from dsv32.engine import lora
from dsv32.rl.grpo.policy import load_policy
from dsv32.rl.grpo.single_turn import train_grpo

LORA = {"lora.enabled": "true", "lora.r": 4, "lora.alpha": 8.0, "grpo.lr": 1e-2}


def _metrics(path):
    return [json.loads(x) for x in (path / "run" / "metrics.jsonl").read_text().splitlines()]


def test_lora_grpo_trains_the_adapter_alone_on_policy_and_resumes_exactly(tmp_path):
    over = {**LORA, "grpo.steps": 2, "grpo.kl_coef": 0.05, "sampling.top_p": 0.9, "save_every": 1}
    straight = load_policy("tiny-llama", device="cpu")
    base = {n: p.detach().clone() for n, p in straight.model.named_parameters()}
    train_grpo(
        letter_recipe(tmp_path / "a", **over), policy=straight, reward_fn=LetterReward(), progress=False
    )
    a = _metrics(tmp_path / "a")
    assert a[0]["first_update_abs_log_ratio"] <= ON_POLICY  # π_θ = π_old at the first update
    assert a[1]["kl"] > 0  # the adapter moved the policy away from the base model (the reference)
    trained = dict(straight.model.named_parameters())
    for n, p in base.items():  # every base weight is where it was; the adapter moved
        key = n if n in trained else n.replace(".weight", ".base_layer.weight")
        assert torch.equal(trained[key], p), n
    assert any(
        not torch.equal(t, 0 * t) for n, t in lora.adapter_state(straight.model).items() if "lora_B" in n
    )

    first = train_grpo(
        letter_recipe(tmp_path / "b", **over), reward_fn=LetterReward(), progress=False, stop_after=1
    )
    assert first.steps == 1
    from safetensors.torch import load_file

    (ckpt,) = (tmp_path / "b" / "run" / "checkpoints").glob("step_*")
    saved = load_file(str(ckpt / "weights.safetensors"))
    assert saved and all(lora.is_adapter_parameter(n) for n in saved)  # the adapter, not the full weights
    resumed = load_policy("tiny-llama", device="cpu")
    train_grpo(
        letter_recipe(tmp_path / "b", **over), policy=resumed, reward_fn=LetterReward(), progress=False
    )
    assert _numbers(_metrics(tmp_path / "b")) == _numbers(a)  # bit for bit
    for (n, p), (_, q) in zip(straight.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.equal(p, q), n

    # exports: model/ holds the merged full weights, adapter/ loads with peft
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run = tmp_path / "a" / "run"
    x = torch.randint(0, 200, (2, 9))
    with torch.no_grad():
        want = straight.model(x).logits
        merged = AutoModelForCausalLM.from_pretrained(run / "model")
        torch.testing.assert_close(merged(x).logits, want, rtol=1e-4, atol=1e-5)
        fresh = load_policy("tiny-llama", device="cpu").model
        peft_model = PeftModel.from_pretrained(fresh, run / "adapter")
        torch.testing.assert_close(peft_model(x).logits, want, rtol=0, atol=0)


def _numbers(records):
    timing = {"seconds", "rollout_s", "update_s", "sync_s"}
    return [{k: v for k, v in r.items() if k not in timing} for r in records]


def test_a_lora_section_naming_a_missing_module_stops_the_run_before_training(tmp_path):
    cfg = letter_recipe(tmp_path, **{**LORA, "lora.target_modules": '["q_proj", "wq_a"]'})
    with pytest.raises(lora.LoRAError, match="wq_a"):
        train_grpo(cfg, reward_fn=LetterReward(), progress=False)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_the_reference_of_a_lora_policy_is_the_base_model_without_a_copy():
    from dsv32.rl.grpo.build import reference_policy
    from dsv32.rl.grpo.config import GRPOConfig

    policy = load_policy("tiny-llama", device="cpu")
    x = torch.randint(0, 200, (2, 9))
    mask = torch.ones_like(x)
    with torch.no_grad():
        want = policy.action_logprobs(x, mask, 4)
    lora.apply_lora(policy.model, lora.LoRAConfig(enabled=True, r=2))
    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            if "lora_B" in n:
                p.normal_()
    ref = reference_policy(policy, GRPOConfig(kl_coef=0.1))
    assert ref.model is policy.model and ref.base_only
    with torch.no_grad():
        got = ref.action_logprobs(x, mask, 4)
        adapted = policy.action_logprobs(x, mask, 4)
    assert torch.equal(got, want) and not torch.equal(adapted, want)
