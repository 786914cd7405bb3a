"""KV-cache decoding equals the full forward, and decode really reads only the selected entries."""

from __future__ import annotations

import pytest
import torch
from helpers.model import record_indexer_topk, token_ids


@pytest.mark.parametrize("prefill", [1, 4, 15])
def test_cached_decoding_equals_full_forward(ours, prefill):
    T = 40  # crosses index_topk = 11: dense, then sparse decode steps
    ids = token_ids(T)
    with torch.no_grad():
        full = ours(ids).logits
        cache = ours.new_cache(2, T)
        steps = [ours(ids[:, :prefill], cache=cache).logits]
        for t in range(prefill, T):
            steps.append(ours(ids[:, t : t + 1], cache=cache).logits)
    assert cache.length == T
    assert (torch.cat(steps, dim=1) - full).abs().max() < 1e-4


def test_chunked_prefill_continues_a_cache(ours):
    """A second multi-token chunk on top of a cache (multi-turn continuation) takes the MQA path."""
    ids = token_ids(36, seed=1)
    with torch.no_grad():
        full = ours(ids).logits
        cache = ours.new_cache(2, 36)
        a = ours(ids[:, :20], cache=cache).logits
        b = ours(ids[:, 20:], cache=cache).logits
    assert (torch.cat((a, b), 1) - full).abs().max() < 1e-4


def test_cache_overflow_is_an_error(ours):
    cache = ours.new_cache(1, 4)
    with pytest.raises(ValueError, match="KV cache overflow"):
        ours(token_ids(5, B=1), cache=cache)


def test_decode_reads_only_selected_entries(ours, monkeypatch):
    cfg = ours.config
    T = 48
    ids = token_ids(T + 1, B=1, seed=5)
    with torch.no_grad():
        cache = ours.new_cache(1, T + 1)
        ours(ids[:, :T], cache=cache)
        saved = (cache.kv_latent.clone(), cache.k_rope.clone(), cache.index_keys.clone())

        calls = record_indexer_topk(monkeypatch)
        reference = ours(ids[:, T:], cache=cache).logits
        assert len(calls) == cfg.num_hidden_layers
        seen = [sel for *_, sel in calls]
        for sel in seen:
            assert sel.shape == (1, 1, cfg.index_topk)  # at most index_topk entries per query
            assert (sel >= 0).all()

        def decode_with(perturb_selected: bool):
            cache.kv_latent.copy_(saved[0])
            cache.k_rope.copy_(saved[1])
            cache.index_keys.copy_(saved[2])
            cache.length = T
            g = torch.Generator().manual_seed(0)
            for layer, sel in enumerate(seen[: cfg.num_hidden_layers]):
                chosen = torch.zeros(T + 1, dtype=torch.bool)  # position T is the new token itself
                chosen[sel.flatten()] = True
                rows = chosen[:T] if perturb_selected else ~chosen[:T]
                noise = torch.randn(int(rows.sum()), cfg.kv_lora_rank, generator=g) * 10
                cache.kv_latent[layer, 0, :T][rows] += noise
                cache.k_rope[layer, 0, :T][rows] -= 3.0
            return ours(ids[:, T:], cache=cache).logits

        unchanged = decode_with(perturb_selected=False)
        changed = decode_with(perturb_selected=True)
    assert torch.equal(unchanged, reference) or (unchanged - reference).abs().max() < 1e-6
    assert (changed - reference).abs().max() > 1e-3  # the same perturbation on selected entries matters


def test_cache_holds_latents_not_per_head_kv(ours):
    cfg = ours.config
    cache = ours.new_cache(2, 10)
    per_token_layer = cache.nbytes() / (2 * 10 * cfg.num_hidden_layers * 4)
    assert per_token_layer == cfg.kv_lora_rank + cfg.qk_rope_head_dim + cfg.index_head_dim


@pytest.mark.parametrize(("cache_batch", "input_batch"), [(3, 1), (1, 3), (2, 3)])
def test_cache_of_another_batch_is_refused_before_anything_is_written(ours, cache_batch, input_batch):
    cache = ours.new_cache(cache_batch, 16)
    with pytest.raises(
        ValueError, match=f"holds {cache_batch} sequences but input_ids has batch {input_batch}"
    ):
        ours(token_ids(8, B=input_batch), cache=cache)
    assert cache.length == 0 and all(not t.any() for t in cache.tensors().values())
