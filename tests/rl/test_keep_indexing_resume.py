"""GRPO of a DSA model with Keep Indexing and the indexer loss on, stopped after a checkpoint and
resumed in a fresh policy: every step record and every weight (the indexer's, trained at its own
rate, included) equal bit for bit to the uninterrupted run's."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from helpers.rl import LetterReward, letter_recipe

from dsv32.rl.grpo.policy import load_policy
from dsv32.rl.grpo.single_turn import train_grpo
from dsv32.runlog import read_metrics

pytestmark = pytest.mark.usefixtures("one_thread")

TIMING = {"seconds", "rollout_s", "update_s", "sync_s"}
OVER = {
    "grpo.steps": 2,
    "grpo.kl_coef": 0.05,
    "grpo.indexer_lr": 1e-2,
    "grpo.keep_indexing": "true",
    "grpo.indexer_loss": "true",
    "save_every": 1,
}


def _policy():
    """A fresh tiny native model whose DSA selects 4 keys, below every context of the run."""
    policy = load_policy("tiny-native", device="cpu")
    for layer in policy.model.model.layers:
        layer.self_attn.index_topk = 4
    return policy


def _run(root, policy, **kw):
    cfg = letter_recipe(root, policy="tiny-native", **OVER)
    return train_grpo(cfg, policy=policy, reward_fn=LetterReward(), progress=False, **kw)


def test_a_resumed_run_with_keep_indexing_and_the_indexer_loss_is_bit_identical(tmp_path):
    straight = _policy()
    a = _run(tmp_path / "a", straight)
    assert _run(tmp_path / "b", _policy(), stop_after=1).steps == 1
    resumed = _policy()  # a fresh process: the weights, both optimizer groups and the RNGs come back
    b = _run(tmp_path / "b", resumed)
    assert b.steps == 2
    rows = [[{k: v for k, v in r.items() if k not in TIMING} for r in read_metrics(x.out_dir / "metrics.jsonl")]
            for x in (a, b)]  # fmt: skip
    assert [r["step"] for r in rows[1]] == [1, 2]
    assert all(r["indexer_loss"] > 0 and r["grad_norm_indexer"] > 0 for r in rows[0])
    assert rows[0] == rows[1]
    weights = dict(resumed.model.named_parameters())
    for n, p in straight.model.named_parameters():
        assert torch.equal(p, weights[n]), n
    initial = dict(_policy().model.named_parameters())
    assert any(not torch.equal(p, initial[n]) for n, p in weights.items() if ".indexer." in n)
