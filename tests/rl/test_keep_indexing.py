"""Keep Indexing and the indexer in post-training: the indexer's selections recorded by the engine
(native V3.2 and an HF model with DSA attached, sparse mode with top-k below the context), replayed in
the training forward, carried through rollouts into the GRPO update; the indexer trained on the RL
batch by Eq. 4 with gradients that never cross between the policy's loss and the indexer's."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from helpers.rl import LetterReward, letter_recipe

from dsv32.dsa import DSAConfig, attach_dsa, get_dsa
from dsv32.dsa.keep import IndexingError
from dsv32.engine import generate
from dsv32.engine.models import load_model
from dsv32.engine.prefix import PrefixCache
from dsv32.rl.grpo.build import trained_grpo
from dsv32.rl.grpo.config import GRPOConfig
from dsv32.rl.grpo.indexing import indexer_losses, is_indexer_parameter
from dsv32.rl.grpo.policy import Policy, load_policy
from dsv32.rl.grpo.rollout import SamplingConfig, rollout
from dsv32.rl.grpo.single_turn import train_grpo
from dsv32.rl.grpo.tasks import Task
from dsv32.runlog import read_metrics

pytestmark = pytest.mark.usefixtures("one_thread")

TOPK = 4


def _model(kind: str):
    loaded = load_model("tiny-native" if kind == "native" else "tiny-llama", device="cpu")
    m = loaded.model.eval()
    if kind == "native":
        for layer in m.model.layers:
            layer.self_attn.index_topk = TOPK
    else:
        attach_dsa(m, config=DSAConfig(index_topk=TOPK, mode="sparse"))
    return m, loaded.tokenizer


def _forward(m, ids, mask, indexing=None, record=False):
    """(logits, recorded selections) of a cache-free forward, forcing ``indexing`` when given."""
    if hasattr(m, "set_dsa_mode"):
        out = m(ids, attention_mask=mask, indexing=indexing, return_indexing=record)
        return out.logits, out.indexing
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    with get_dsa(m).indexing(forced=indexing, record=record) as handle:
        out = m(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
        return out.logits, handle.stacked_indexing() if record else None


def _batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (2, 16), generator=g)
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, :5] = 0  # a left-padded row
    return ids, mask


@pytest.mark.parametrize("kind", ["native", "hf"])
@pytest.mark.parametrize("impl", ["masked", "gather"])
def test_replay_of_the_own_selection_is_the_forward_bit_for_bit(kind, impl):
    m, _ = _model(kind)
    if kind == "native":
        m.set_dsa_mode("sparse", impl)
    else:
        get_dsa(m).config = get_dsa(m).config.__class__(**{**vars(get_dsa(m).config), "sparse_impl": impl})
    ids, mask = _batch()
    with torch.no_grad():
        logits, rec = _forward(m, ids, mask, record=True)
        replayed, again = _forward(m, ids, mask, indexing=rec, record=True)
    assert rec.dtype == torch.int32 and rec.shape[2:] == (16, TOPK)
    assert bool((rec[:, 1, :5] == -1).all())  # padding queries select nothing
    first = rec[:, 0, 0].sort(-1).values  # the first query sees one key (slot order is unspecified)
    assert torch.equal(first, torch.tensor([-1, -1, -1, 0], dtype=torch.int32).expand_as(first))
    assert torch.equal(replayed, logits)
    assert torch.equal(again.sort(-1).values, rec.sort(-1).values)


@pytest.mark.parametrize("kind", ["native", "hf"])
def test_a_forced_selection_is_honoured_per_layer_and_token(kind):
    m, _ = _model(kind)
    ids, mask = _batch()
    with torch.no_grad():
        logits, rec = _forward(m, ids, mask, record=True)
        t, b = 10, 0  # query position 10 of row 0 sees 11 keys and selects 4
        chosen = rec[0, b, t]
        other = next(s for s in range(t + 1) if s not in chosen.tolist())
        forced = rec.clone()
        forced[0, b, t, 0] = other  # layer 0 only: swap one key the indexer picked for one it did not
        changed, _ = _forward(m, ids, mask, indexing=forced)
    assert torch.equal(changed[b, :t], logits[b, :t])  # earlier positions: untouched
    assert not torch.allclose(changed[b, t], logits[b, t])  # the forced position follows the selection
    assert torch.equal(changed[1], logits[1])  # other rows: untouched


@pytest.mark.parametrize("kind", ["native", "hf"])
def test_the_engine_records_what_the_trainer_replays(kind):
    m, _ = _model(kind)
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [5, 6, 7]]  # left padding in the engine's batch
    g = torch.Generator().manual_seed(1)
    out = generate(m, prompts, max_new_tokens=6, eos_token_id=[], generator=g, return_indexing=True)
    seq, mask = out.sequences, out.attention_mask
    assert out.indexing.shape[1:] == (2, seq.shape[1] - 1, TOPK)
    with torch.no_grad():
        logits, rec = _forward(m, seq[:, :-1], mask[:, :-1], indexing=out.indexing, record=True)
        # the short row alone, without the engine's padding: the same row positions
        alone, _ = _forward(m, seq[1:, 3:-1], mask[1:, 3:-1], indexing=out.indexing[:, 1:, 3:])
    logp = torch.log_softmax(logits[:, -6:], -1).gather(-1, seq[:, -6:, None])[..., 0]
    assert torch.allclose(logp, out.logprobs, atol=1e-5)
    assert torch.equal(rec.sort(-1).values, out.indexing.sort(-1).values)
    assert torch.allclose(alone[0, -6:], logits[1, -6:], atol=1e-5)


def test_refusals_are_typed():
    m, _ = _model("native")
    with pytest.raises(IndexingError, match="prefix cache"):
        generate(m, [[1, 2, 3]], max_new_tokens=2, return_indexing=True, prefix=PrefixCache())
    m.set_dsa_mode("dense")
    with pytest.raises(IndexingError, match="sparse mode"):
        generate(m, [[1, 2, 3]], max_new_tokens=2, return_indexing=True)
    plain = load_model("tiny-llama", device="cpu").model
    with pytest.raises(IndexingError, match="no DSA attached"):
        generate(plain, [[1, 2, 3]], max_new_tokens=2, return_indexing=True)
    m.set_dsa_mode("sparse")
    with pytest.raises(IndexingError, match="indexing must be"):
        m(torch.zeros(1, 12, dtype=torch.long), indexing=torch.zeros(2, 1, 11, TOPK, dtype=torch.int32))


@pytest.mark.parametrize("kind", ["native", "hf"])
def test_gradients_do_not_cross_between_policy_and_indexer(kind):
    m, _ = _model(kind)
    m.train()
    ids, mask = _batch()
    _, rec = _forward(m, ids, mask, record=True)
    names = dict(m.named_parameters())
    with indexer_losses(m, True) as losses:
        logits, _ = _forward(m, ids, mask, indexing=rec.detach())
    assert len(losses) == 2
    policy_loss = logits.float().logsumexp(-1).sum()
    index_loss = sum(losses.values())
    for loss, other_side in ((policy_loss, True), (index_loss, False)):
        grads = torch.autograd.grad(loss, list(names.values()), allow_unused=True, retain_graph=True)
        for (name, _), g in zip(names.items(), grads):
            if is_indexer_parameter(name) == other_side:
                assert g is None or not bool(g.any()), f"{name} got a gradient from the other side's loss"
    grads = torch.autograd.grad(index_loss, [p for n, p in names.items() if is_indexer_parameter(n)])
    assert any(bool(g.any()) for g in grads)  # the indexer learns from its own loss


def test_rollouts_carry_the_selections_into_the_training_forward():
    m, tok = _model("native")
    policy = Policy(m, tok, "native")
    tasks = [Task(id=f"t{i}", domain="toy", prompt=p) for i, p in enumerate(["hello there", "q"])]
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=6)
    batch = rollout(
        policy, tasks, 2, sampling, generator=torch.Generator().manual_seed(0), keep_indexing=True
    )
    L = batch.sequences.shape[1]
    assert batch.indexing is not None and batch.indexing.shape == (2, 4, L - 1, TOPK)
    with torch.no_grad():
        logp = policy.action_logprobs(**batch.rows(torch.arange(4)))
    acts = batch.action_mask
    assert torch.allclose(logp[acts], batch.sampling_logprobs[acts], atol=1e-5)


def test_the_switches_apply_only_to_sparse_dsa_models():
    g = GRPOConfig()
    assert g.keep_indexing and g.indexer_loss
    dense = load_policy("tiny-llama", device="cpu")
    assert not trained_grpo(g, dense).keep_indexing and not trained_grpo(g, dense).indexer_loss
    native = load_policy("tiny-native", device="cpu")
    assert trained_grpo(g, native).keep_indexing and trained_grpo(g, native).indexer_loss
    native.model.set_dsa_mode("dense")
    assert not trained_grpo(g, native).keep_indexing


@pytest.mark.parametrize("indexer_loss", [True, False])
def test_grpo_trains_the_indexer_by_its_own_loss(tmp_path, indexer_loss):
    over = {
        "grpo.steps": 2,
        "seed": 3,
        "grpo.indexer_lr": 1e-2,
        "grpo.indexer_loss": str(indexer_loss).lower(),
    }
    cfg = letter_recipe(tmp_path, policy="tiny-native", **over)
    policy = load_policy("tiny-native", device="cpu")
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters() if is_indexer_parameter(n)}
    result = train_grpo(cfg, policy=policy, reward_fn=LetterReward(), progress=False)
    records = read_metrics(result.out_dir / "metrics.jsonl")
    after = dict(policy.model.named_parameters())
    moved = any(not torch.equal(before[n], after[n]) for n in before)
    assert moved == indexer_loss
    if indexer_loss:
        assert all(r["indexer_loss"] > 0 and r["grad_norm_indexer"] > 0 for r in records)
    else:
        assert all("indexer_loss" not in r for r in records)
