"""Agentic GRPO with a LoRA adapter on the tiny tool user: episodes of two model calls (the tool call,
then the answer), only the adapter's weights change, and every step's first update is on-policy."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from helpers.agentic import agentic_config
from helpers.tolerances import ON_POLICY

from dsv32.engine import lora
from dsv32.rl.agentic.trainer import train_agentic
from dsv32.runlog import read_metrics

pytestmark = pytest.mark.usefixtures("one_thread")

ECHO_ONLY = [{"name": "echo-test", "tasks": "train", "weight": 1.0}]


def test_lora_agentic_grpo_moves_only_the_adapter_and_stays_on_policy(tool_user, tmp_path):
    over = {"lora.enabled": True, "lora.r": 4, "lora.alpha": 8.0, "grpo.lr": 1e-2, "envs": ECHO_ONLY,
            "agentic.single_turn": False, "agentic.eval_tasks": 0, "grpo.prompts_per_step": 2,
            "grpo.group_size": 4, "sampling.temperature": 1.0}  # fmt: skip
    base = {n: p.detach().clone() for n, p in tool_user.model.named_parameters()}
    result = train_agentic(
        agentic_config(tmp_path, **over), policy=tool_user, progress=False, evaluate_before=False,
        evaluate_after=False,
    )  # fmt: skip
    records = read_metrics(result.out_dir / "metrics.jsonl")
    assert len(records) == 2 and records[0]["reward_std"] > 0  # advantages to learn from
    for r in records:
        assert r["first_update_abs_log_ratio"] <= ON_POLICY  # π_θ = π_old at each step's first update
        assert r["mean_steps"] >= 1.5  # episodes of two model calls: the tool call, then the answer
    trained = dict(tool_user.model.named_parameters())
    for n, p in base.items():  # every base weight is where it was
        key = (
            n
            if n in trained
            else n.replace(".weight", ".base_layer.weight").replace(".bias", ".base_layer.bias")
        )
        assert torch.equal(trained[key], p), n
    assert not any(p.requires_grad for n, p in trained.items() if not lora.is_adapter_parameter(n))
    moved = [n for n, t in lora.adapter_state(tool_user.model).items() if "lora_B" in n and t.abs().max() > 0]
    assert moved  # the adapter learned
    assert records[-1]["kl"] > 0  # against the base model, the reference
