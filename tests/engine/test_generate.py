"""Batched generation on the native V3.2 model and the records RL needs (logprobs, kept sets, routing)."""

from __future__ import annotations

import pytest
import torch
from helpers.engine import tiny_native

from dsv32.engine import generate, kept_logprobs


@pytest.fixture(scope="module")
def model():
    return tiny_native()


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
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.kept_token_ids, b.kept_token_ids)
    kept = a.kept_token_ids
    assert kept.dtype == torch.int32 and kept.shape[:2] == (2, 10) and 1 <= kept.shape[2] <= 20
    assert kept.shape[2] == int((kept >= 0).sum(-1).max())  # K = the largest kept set, no wider
    assert (kept == a.tokens[..., None]).sum(-1).eq(1).all()  # the sampled token is kept, once
    assert (a.logprobs <= 0).all() and (a.logprobs[(kept >= 0).sum(-1) > 1] < 0).all()
    # π_old renormalized over the kept ids, recomputed from a full forward, is the sampling log-prob
    with torch.no_grad():
        logits = model(a.sequences[:, :-1], attention_mask=a.attention_mask[:, :-1]).logits[:, -10:]
    renorm = kept_logprobs(logits, kept, 0.8)
    at = (kept == a.tokens[..., None]).int().argmax(-1, keepdim=True)
    torch.testing.assert_close(renorm.gather(-1, at).squeeze(-1), a.logprobs, rtol=0, atol=1e-4)


def test_finished_rows_leave_the_batch_and_the_others_are_unchanged(model):
    prompts = [[5, 9, 12], [8, 4, 2, 30]]
    free = generate(model, prompts, max_new_tokens=12, temperature=0.0, eos_token_id=[], return_kept=True)
    eos = int(free.tokens[0, 2])
    assert eos not in free.tokens[1].tolist()
    out = generate(model, prompts, 12, 0.0, eos_token_id=eos, pad_token_id=0, return_kept=True)
    first = free.tokens[0].tolist().index(eos)
    assert out.lengths.tolist() == [first + 1, 12]
    assert torch.equal(out.tokens[1], free.tokens[1])
    torch.testing.assert_close(out.logprobs[1], free.logprobs[1], rtol=0, atol=1e-4)
    assert (out.logprobs[0, first + 1 :] == 0).all() and (out.tokens[0, first + 1 :] == 0).all()  # pad
    assert out.kept_token_ids.shape == (2, 12, 1)  # greedy: the argmax
    assert torch.equal(out.kept_token_ids[1, :, 0], free.tokens[1].int())
    assert (out.kept_token_ids[0, first + 1 :] == -1).all()


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


def test_a_token_outside_the_vocabulary_is_a_value_error_and_a_long_run_warns(model, monkeypatch):
    V = model.config.vocab_size
    for bad in (V, -3):
        with pytest.raises(
            ValueError, match=f"prompt token id {bad} is outside the model's vocabulary of {V}"
        ):
            generate(model, [[1, 2], [bad, 4, 5]], max_new_tokens=2)
    monkeypatch.setattr(model.config, "max_position_embeddings", 4)  # read by the check only
    with pytest.warns(UserWarning, match=r"= 5 positions, beyond the model's max_position_embeddings \(4\)"):
        generate(model, [[2, 3, 4]], max_new_tokens=2, temperature=0.0)


def test_a_right_padded_attention_mask_is_a_value_error_naming_left_padding(model):
    ids = torch.tensor([[10, 20, 30, 40], [50, 60, 0, 0]])
    right = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    with pytest.raises(ValueError, match=r'row 1 ends with padding.*tokenizer.padding_side = "left"'):
        generate(model, ids, attention_mask=right, max_new_tokens=2, temperature=0.0)
    ids, left = torch.tensor([[10, 20, 30, 40], [0, 0, 50, 60]]), torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    out = generate(model, ids, attention_mask=left, max_new_tokens=3, temperature=0.0)
    alone = generate(model, [[50, 60]], max_new_tokens=3, temperature=0.0)
    assert torch.equal(out.tokens[1], alone.tokens[0])
