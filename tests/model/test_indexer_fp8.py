"""The model's FP8 indexer setting: it selects what indexer_topk(..., fp8=...) selects, and a cached
decode (keys quantized as they enter the cache) equals the full forward."""

from __future__ import annotations

import pytest
import torch
from helpers.model import record_indexer_topk, token_ids

from dsv32.dsa import indexer_topk


@pytest.mark.parametrize("fmt", ["ue8m0", "float"])
def test_the_model_selects_as_the_fp8_indexer(fresh_ours, monkeypatch, fmt):
    ids = token_ids(40)  # beyond index_topk = 11: every layer selects
    calls = record_indexer_topk(monkeypatch)
    with torch.no_grad():
        fresh_ours(ids)
        (q, w, keys, k), _, exact = calls[0]  # the first layer's inputs do not depend on any selection
        fresh_ours.set_indexer_fp8(fmt)
        fresh_ours(ids)
    fp8_selection = calls[len(calls) // 2][2]
    want = indexer_topk(q, w, keys, k, fp8=fmt)
    assert torch.equal(fp8_selection.sort(-1).values, want.sort(-1).values)
    assert not torch.equal(fp8_selection.sort(-1).values, exact.sort(-1).values)


def test_fp8_cached_decoding_equals_the_full_forward(fresh_ours):
    fresh_ours.set_indexer_fp8("ue8m0")
    T = 40
    ids = token_ids(T, seed=3)
    with torch.no_grad():
        full = fresh_ours(ids).logits
        cache = fresh_ours.new_cache(2, T)
        steps = [fresh_ours(ids[:, :6], cache=cache).logits]
        for t in range(6, T):
            steps.append(fresh_ours(ids[:, t : t + 1], cache=cache).logits)
    assert (torch.cat(steps, dim=1) - full).abs().max() < 1e-4


def test_the_setting_is_checked_and_can_be_undone(fresh_ours):
    with pytest.raises(ValueError, match="scale_format"):
        fresh_ours.set_indexer_fp8("e5m2")
    fresh_ours.set_indexer_fp8("float")
    assert {layer.self_attn.indexer_fp8 for layer in fresh_ours.model.layers} == {"float"}
    fresh_ours.set_indexer_fp8(None)
    assert {layer.self_attn.indexer_fp8 for layer in fresh_ours.model.layers} == {None}
