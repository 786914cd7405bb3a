"""Batched generation, sampling truncation and the records RL needs (logprobs, kept sets, routing)."""

from __future__ import annotations

import math

import pytest
import torch

from dsv32.engine import SamplingParams, generate, kept_mask, sample_next
from dsv32.model import DeepseekV32, ModelConfig


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=96, hidden_size=48, intermediate_size=64, moe_intermediate_size=24, num_hidden_layers=3,
        first_k_dense_replace=1, num_attention_heads=4, n_routed_experts=8, n_group=4, topk_group=2,
        num_experts_per_tok=2, q_lora_rank=32, kv_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=8,
        v_head_dim=8, index_n_heads=4, index_head_dim=16, index_topk=8, rope_scaling=None, eos_token_id=1,
    )  # fmt: skip
    m = DeepseekV32(cfg).eval()
    m.init_weights(std=0.3)  # peaky logits so that greedy decoding is not decided by rounding
    return m


def test_ragged_batch_equals_generating_each_prompt_alone(model):
    prompts = [[5, 9, 12, 40, 7, 3, 22, 18, 30, 2, 11, 6], [8, 4, 2], [60, 61, 62, 63, 64, 65, 66]]
    batch = generate(model, prompts, max_new_tokens=20, temperature=0.0, eos_token_id=[])
    assert batch.sequences.shape == (3, 12 + 20)
    for i, p in enumerate(prompts):
        alone = generate(model, [p], max_new_tokens=20, temperature=0.0, eos_token_id=[])
        assert torch.equal(batch.tokens[i], alone.tokens[0])
        assert torch.allclose(batch.logprobs[i], alone.logprobs[0], atol=1e-4)


def test_stops_at_eos_and_pads_after(model):
    prompt = [[5, 9, 12]]
    free = generate(model, prompt, max_new_tokens=12, temperature=0.0, eos_token_id=[])
    eos = int(free.tokens[0, 4])  # pretend the 5th generated token is EOS
    out = generate(model, prompt, max_new_tokens=12, temperature=0.0, eos_token_id=eos, pad_token_id=0)
    first = int((free.tokens[0] == eos).nonzero()[0])
    assert out.lengths.tolist() == [first + 1]
    assert out.tokens.shape[1] == first + 1  # the whole batch finished: no wasted steps
    assert out.attention_mask[0, -1] == 1


def test_greedy_logprobs_are_model_logprobs(model):
    out = generate(model, [[3, 4, 5, 6]], max_new_tokens=6, temperature=0.0, eos_token_id=[])
    with torch.no_grad():
        logits = model(out.sequences[:, :-1]).logits.log_softmax(-1)
    expected = logits[0, 3:].gather(-1, out.tokens[0, :, None]).squeeze(-1)
    assert torch.allclose(out.logprobs[0], expected, atol=1e-4)


def test_sampling_is_reproducible_and_records_kept_sets(model):
    kw = dict(max_new_tokens=10, temperature=0.8, top_p=0.9, top_k=20, eos_token_id=[], return_kept=True)
    a = generate(model, [[1, 2, 3], [4, 5]], generator=torch.Generator().manual_seed(0), **kw)
    b = generate(model, [[1, 2, 3], [4, 5]], generator=torch.Generator().manual_seed(0), **kw)
    assert torch.equal(a.tokens, b.tokens)
    for row in range(2):
        assert len(a.kept_token_ids[row]) == 10
        for step, kept in enumerate(a.kept_token_ids[row]):
            assert 1 <= len(kept) <= 20
            assert int(a.tokens[row, step]) in kept.tolist()
    assert (a.logprobs <= 0).all()


def test_top_k_and_top_p_truncation():
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    assert kept_mask(logits, SamplingParams(top_k=2)).tolist() == [[True, True, False, False, False]]
    # mass before each token: 0, .5, .7, .85, .95 -> top_p=0.8 keeps the first three
    assert kept_mask(logits, SamplingParams(top_p=0.8)).tolist() == [[True, True, True, False, False]]
    assert kept_mask(logits, SamplingParams(top_p=0.01)).tolist() == [[True, False, False, False, False]]
    tok, logp, keep = sample_next(logits, SamplingParams(top_p=0.8), torch.Generator().manual_seed(1))
    assert keep[0, tok].item()
    assert math.isclose(logp.exp().item(), [0.5, 0.2, 0.15][tok.item()] / 0.85, rel_tol=1e-5)


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-2)])
def test_bad_sampling_params(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def test_routing_is_recorded_and_replays_exactly(model):
    out = generate(
        model, [[7, 8, 9, 10, 11]], max_new_tokens=6, temperature=0.0, eos_token_id=[], return_routing=True
    )
    cfg = model.config
    seq = out.sequences[:, :-1]
    assert out.routing.shape == (cfg.num_moe_layers, 1, seq.shape[1], cfg.num_experts_per_tok)
    with torch.no_grad():
        live = model(seq, return_routing=True)
        replay = model(seq, routing=out.routing)
    # the training forward chooses the same experts as the decode steps did
    assert torch.equal(live.routing.sort(-1).values, out.routing.sort(-1).values)
    assert (replay.logits - live.logits).abs().max() < 1e-5
