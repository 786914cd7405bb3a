"""Our DeepseekV32 against transformers' DeepseekV32ForCausalLM on a tiny fully random checkpoint."""

from __future__ import annotations

import pytest
import torch

from dsv32.engine import generate

TOPK = 11  # index_topk of the tiny config


@pytest.mark.parametrize("T", [5, TOPK, 23, 48])
@pytest.mark.parametrize("impl", ["gather", "masked"])
def test_logits_match_transformers(hf_checkpoint, fresh_ours, T, impl):
    hf, _ = hf_checkpoint
    fresh_ours.set_dsa_mode("sparse", impl)
    ids = torch.randint(0, hf.config.vocab_size, (3, T), generator=torch.Generator().manual_seed(T))
    with torch.no_grad():
        expected = hf(ids).logits
        got = fresh_ours(ids).logits
    assert got.shape == (3, T, hf.config.vocab_size)
    assert (got - expected).abs().max().item() < 1e-4


def test_dense_mode_differs_beyond_topk(hf_checkpoint, fresh_ours):
    """Sanity check that the parity above is about sparsity: dense attention is *not* DSA once
    queries see more than index_topk keys (and is identical before)."""
    hf, _ = hf_checkpoint
    ids = torch.randint(0, hf.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(1))
    fresh_ours.set_dsa_mode("dense")
    with torch.no_grad():
        expected = hf(ids).logits
        got = fresh_ours(ids).logits
    assert (got[:, :TOPK] - expected[:, :TOPK]).abs().max() < 1e-4
    assert (got[:, TOPK:] - expected[:, TOPK:]).abs().max() > 1e-2


def test_left_padded_batch_matches_transformers(hf_checkpoint, ours):
    hf, _ = hf_checkpoint
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(2, hf.config.vocab_size, (2, 30), generator=g)
    mask = torch.ones(2, 30, dtype=torch.long)
    mask[1, :9] = 0  # row 1 is a 21-token prompt, left-padded
    with torch.no_grad():
        expected = hf(ids, attention_mask=mask).logits
        got = ours(ids, attention_mask=mask).logits
        alone = ours(ids[1:, 9:]).logits
    assert torch.isfinite(got).all()
    real = mask.bool()
    assert (got[real] - expected[real]).abs().max() < 1e-4
    assert (got[1, 9:] - alone[0]).abs().max() < 1e-4


def test_greedy_generation_matches_transformers(hf_checkpoint, ours):
    hf, _ = hf_checkpoint
    prompt = torch.randint(2, hf.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = hf.generate(
            prompt, max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0, min_new_tokens=32
        )
    got = generate(ours, prompt, max_new_tokens=32, temperature=0.0, eos_token_id=[])
    assert got.sequences.shape == (1, 38)
    assert torch.equal(got.sequences, expected)
