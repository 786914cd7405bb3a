"""Keep Indexing in agentic GRPO on a DSA model: the tiny native V3.2 model (sparse mode, top-k 8,
below contexts of hundreds of tokens) taught to call the echo tool, so its episodes take several
model calls. Each call of the batched episodes records the indexer's selections (the batcher then
prefills every call in full: a prefix-reused call cannot record the kept positions, and the engine
refuses to be asked for both); the rows carry them into the update, which replays them."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from helpers.agentic import (
    SAMPLING,
    SETTINGS,
    TASKS,
    TEMPERATURE,
    EchoEnv,
    agentic_config,
    episodes_batch,
    train_tool_user,
)

import dsv32.rl.grpo.trainer as grpo_trainer
from dsv32.dsa.keep import IndexingError
from dsv32.engine import generate
from dsv32.engine.prefix import PrefixCache
from dsv32.rl.agentic.batcher import LockstepBatcher
from dsv32.rl.agentic.episodes import run_episodes
from dsv32.rl.agentic.trainer import train_agentic
from dsv32.rl.grpo.indexing import indexer_losses, is_indexer_parameter

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def native_tool_user(tmp_path_factory):
    torch.set_num_threads(1)
    policy = train_tool_user("tiny-native", tmp_path_factory.mktemp("native_tool_user"))
    assert all(layer.self_attn.dsa_mode == "sparse" for layer in policy.model.model.layers)
    return policy


def test_episode_calls_record_the_selections_that_the_training_forward_replays(native_tool_user):
    policy = native_tool_user
    k = policy.model.model.layers[0].self_attn.index_topk
    jobs = [(EchoEnv, TASKS[i % 4], "echo") for i in range(4)]
    gen = torch.Generator().manual_seed(0)
    episodes = run_episodes(policy, jobs, SAMPLING, SETTINGS, generator=gen, keep_indexing=True)
    records = [r for e in episodes for r in e.records]
    assert len(records) > len(episodes)  # several model calls per episode
    for r in records:  # every position of every call: [layers, prompt + new - 1, k]
        assert r.indexing is not None and r.indexing.shape == (2, len(r.prompt) + len(r.tokens) - 1, k)
        assert len(r.prompt) + len(r.tokens) > 4 * k  # the calls select
    _, batch = episodes_batch(policy, episodes)
    assert batch.indexing is not None
    every = torch.arange(len(batch))
    # the indexer one update behind the engine: 3 AdamW steps on its loss over the batch
    params = [p for n, p in policy.model.named_parameters() if is_indexer_parameter(n)]
    opt = torch.optim.AdamW(params, lr=3e-2)
    for _ in range(3):
        with indexer_losses(policy.model, True) as losses:
            policy.action_logprobs(**batch.rows(every), temperature=TEMPERATURE)
        (sum(losses.values()) / len(losses)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    m = batch.action_mask
    with torch.no_grad():
        replayed = policy.action_logprobs(**batch.rows(every), temperature=TEMPERATURE)
        recomputed = policy.action_logprobs(
            **(batch.rows(every) | {"indexing": None}), temperature=TEMPERATURE
        )
    replayed_err = float((replayed - batch.sampling_logprobs)[m].abs().max())
    recomputed_err = float((recomputed - batch.sampling_logprobs)[m].abs().max())
    assert replayed_err < 1e-5 and recomputed_err > 100 * max(replayed_err, 1e-7), (
        replayed_err,
        recomputed_err,
    )


def test_a_prefix_reused_call_is_not_asked_to_record(native_tool_user):
    policy = native_tool_user
    batcher = LockstepBatcher(policy, SAMPLING, [policy.eos_token_id[0]], 2, keep_indexing=True)
    assert batcher.prefix is None  # every call prefilled in full, so every position is recorded
    assert LockstepBatcher(policy, SAMPLING, [policy.eos_token_id[0]], 2).prefix is not None
    with pytest.raises(IndexingError, match="prefix cache"):
        generate(policy.model, [[1, 2, 3]], max_new_tokens=2, return_indexing=True, prefix=PrefixCache())


def test_the_first_agentic_update_replays_the_episodes_selections(native_tool_user, tmp_path, monkeypatch):
    seen = []

    def spy(policy, optimizer, batch, advantages, cfg, **kwargs):
        seen.append((batch, cfg))
        return real(policy, optimizer, batch, advantages, cfg, **kwargs)

    real = grpo_trainer.grpo_update
    monkeypatch.setattr(grpo_trainer, "grpo_update", spy)
    cfg = agentic_config(tmp_path, **{"grpo.steps": 1, "agentic.eval_tasks": 0})
    result = train_agentic(
        cfg, policy=native_tool_user, progress=False, evaluate_before=False, evaluate_after=False
    )
    ((batch, grpo),) = seen
    assert grpo.keep_indexing and grpo.indexer_loss  # on by default for a sparse DSA model
    episodes = [i for i, t in enumerate(batch.tasks) if t.domain == "echo-test"]
    assert episodes and batch.indexing is not None
    assert bool((batch.indexing[:, episodes] >= 0).any())
    record = result.metrics[0]
    assert record["first_update_abs_log_ratio"] < 1e-5, record["first_update_abs_log_ratio"]
    assert record["indexer_loss"] > 0 and record["grad_norm_indexer"] > 0
