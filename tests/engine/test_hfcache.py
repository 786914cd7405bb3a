"""GrowingCache: transformers' DynamicCache with K/V (and DSA indexer keys) appended in place, held
to DynamicCache itself and to a full forward."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import DynamicCache  # noqa: E402
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer  # noqa: E402

from dsv32.engine.backends import crop_hf_cache, hf_cache_keyword, hf_index_keys  # noqa: E402
from dsv32.engine.hfcache import GrowingCache, GrowingLayer  # noqa: E402

from .test_hf import tiny  # noqa: E402


def _decode(model, cache, ids: torch.Tensor, prefill: int) -> list[torch.Tensor]:
    """Prefill ``ids[:, :prefill]``, then feed the rest one token at a time; every step's last logits."""
    out = [model(ids[:, :prefill], **{hf_cache_keyword(model): cache}, use_cache=True).logits[:, -1]]
    for t in range(prefill, ids.shape[1]):
        out.append(model(ids[:, t : t + 1], **{hf_cache_keyword(model): cache}, use_cache=True).logits[:, -1])
    return out


def test_decoding_matches_dynamic_cache_to_the_bit_and_writes_in_place():
    model = tiny("qwen3")
    ids = torch.randint(0, 257, (2, 60), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = _decode(model, DynamicCache(config=model.config), ids, 20)
        cache = GrowingCache(model.config)
        assert all(type(layer) is GrowingLayer for layer in cache.layers)
        grown = _decode(model, cache, ids, 20)
    for a, b in zip(reference, grown, strict=True):
        assert torch.equal(a, b)
    # 20 tokens + 256 headroom: one buffer per tensor held every step
    layer = cache.layers[0]
    assert layer.keys.shape[2] == 60 and layer.keys.data_ptr() == layer._keys.buffer.data_ptr()


def test_crop_keeps_the_buffers_and_the_continuation_matches_a_full_forward():
    model = tiny("llama")
    ids = torch.tensor([list(range(10, 50))])
    with torch.no_grad():
        full = model(ids).logits[0, -1]
        cache = GrowingCache(model.config)
        model(ids[:, :30], **{hf_cache_keyword(model): cache}, use_cache=True)
        model(
            torch.tensor([[3, 4, 5]]), **{hf_cache_keyword(model): cache}, use_cache=True
        )  # a branch to discard
        buffers = [layer._keys.buffer for layer in cache.layers]
        crop_hf_cache(cache, 30)
        assert cache.get_seq_length() == 30
        out = model(ids[:, 30:], **{hf_cache_keyword(model): cache}, use_cache=True).logits[0, -1]
    assert all(layer._keys.buffer is b for layer, b in zip(cache.layers, buffers, strict=True))
    torch.testing.assert_close(out, full, rtol=1e-5, atol=1e-5)


def test_sliding_window_layers_stay_transformers_own():
    config = transformers.MistralConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=8,
    )
    cache = GrowingCache(config)
    assert all(type(layer) is DynamicSlidingWindowLayer for layer in cache.layers)
    assert not any(isinstance(layer, GrowingLayer) for layer in cache.layers)
    assert isinstance(cache, DynamicCache) and issubclass(GrowingLayer, DynamicLayer)


def test_a_forward_with_gradients_over_the_cache_backpropagates_like_dynamic_cache():
    from dsv32.dsa import attach_dsa

    ids = torch.tensor([list(range(20, 56))])
    grads = []
    for cache_cls in (DynamicCache, GrowingCache):
        model = tiny("llama")
        attach_dsa(model, 2, 16, 4, mode="sparse")
        cache = cache_cls(config=model.config)
        first = model(ids[:, :24], **{hf_cache_keyword(model): cache}, use_cache=True).logits
        second = model(ids[:, 24:], **{hf_cache_keyword(model): cache}, use_cache=True).logits
        (first.square().mean() + second.square().mean()).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-6)


def test_dsa_indexer_keys_grow_in_place_and_decoding_matches_a_full_forward():
    from dsv32.dsa import attach_dsa

    model = tiny("llama")
    attach_dsa(model, 2, 16, 4, mode="sparse")
    ids = torch.randint(0, 257, (1, 48), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        cache = GrowingCache(model.config)
        model(ids[:, :30], **{hf_cache_keyword(model): cache}, use_cache=True)
        pointers = {layer: keys.data_ptr() for layer, keys in hf_index_keys(cache).items()}
        for t in range(30, 47):
            model(ids[:, t : t + 1], **{hf_cache_keyword(model): cache}, use_cache=True)
        last = model(ids[:, 47:], **{hf_cache_keyword(model): cache}, use_cache=True).logits[0, -1]
        full = model(ids).logits[0, -1]
    store = hf_index_keys(cache)
    assert {layer: keys.data_ptr() for layer, keys in store.items()} == pointers
    assert all(keys.shape[1] == 48 for keys in store.values())
    torch.testing.assert_close(last, full, rtol=1e-4, atol=1e-4)


def test_the_indexer_loss_of_a_forward_that_fills_a_cache_trains_the_indexer():
    from dsv32.dsa import attach_dsa, get_dsa

    ids = torch.tensor([list(range(20, 56))])
    grads = []
    for cache in (None, "growing"):
        model = tiny("llama")
        attach_dsa(model, 2, 16, 4, mode="sparse")
        handle = get_dsa(model)
        handle.collect_loss = True
        past = GrowingCache(model.config) if cache else None
        model(ids, **{hf_cache_keyword(model): past}, use_cache=past is not None)
        sum(handle.pop_losses().values()).backward()
        grads.append(torch.cat([m.indexer.wk.weight.grad.flatten() for m in handle.modules.values()]))
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[1], grads[0])


def test_training_only_the_queries_over_a_cache_backpropagates():
    """With K/V frozen (LoRA-style on q_proj alone) autograd still saves K/V for the queries'
    gradient: a forward with gradients enabled must not write into what an earlier one saved."""
    ids = torch.tensor([list(range(20, 56))])
    grads = []
    for cache_cls in (DynamicCache, GrowingCache):
        model = tiny("llama")
        for name, p in model.named_parameters():
            p.requires_grad_("q_proj" in name)
        cache = cache_cls(config=model.config)
        first = model(ids[:, :24], **{hf_cache_keyword(model): cache}, use_cache=True).logits
        second = model(ids[:, 24:], **{hf_cache_keyword(model): cache}, use_cache=True).logits
        (first.square().mean() + second.square().mean()).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[1], grads[0])


def test_a_prefill_in_inference_mode_decodes_outside_it():
    model = tiny("llama")
    ids = torch.tensor([list(range(30, 50))])
    cache = GrowingCache(model.config)
    with torch.inference_mode():
        model(ids[:, :15], **{hf_cache_keyword(model): cache}, use_cache=True)
    with torch.no_grad():
        out = model(ids[:, 15:], **{hf_cache_keyword(model): cache}, use_cache=True).logits[0, -1]
        full = model(ids).logits[0, -1]
    torch.testing.assert_close(out, full, rtol=1e-5, atol=1e-5)


def test_whatever_replaces_the_kv_frees_the_buffers_and_decoding_goes_on():
    model = tiny("llama")
    ids = torch.tensor([list(range(30, 50)), list(range(60, 80))])
    with torch.no_grad():
        cache = GrowingCache(model.config)
        model(ids[:, :15], **{hf_cache_keyword(model): cache}, use_cache=True)
        cache.batch_select_indices(torch.tensor([1]))  # keep the second row only
        assert all(layer._keys.buffer is None and layer._values.buffer is None for layer in cache.layers)
        out = model(ids[1:, 15:], **{hf_cache_keyword(model): cache}, use_cache=True).logits[0, -1]
        full = model(ids[1:]).logits[0, -1]
        layer = cache.layers[0]
        layer.keys = layer.keys.clone()  # assigned from outside, as the engine's batch merge does
        assert layer._keys.buffer is None and layer._values.buffer is not None
        cache.reset()
        assert all(layer._keys.buffer is None for layer in cache.layers)
    torch.testing.assert_close(out, full, rtol=1e-5, atol=1e-5)
