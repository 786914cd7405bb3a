"""attach_dsa on tiny random Hugging Face models of the four supported families."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from helpers.engine import hf_families

from dsv32.dsa import (
    DSAError,
    attach_dsa,
    detach_dsa,
    get_dsa,
    index_scores,
    indexer_kl_loss,
    load_dsa,
    save_dsa,
)

FAMILIES = hf_families()


def tiny(kind: str = "llama", seed: int = 0, **extra):
    config_cls, model_cls = FAMILIES[kind]
    torch.manual_seed(seed)
    config = config_cls(
        vocab_size=97,
        hidden_size=48,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,  # GQA
        head_dim=8,
        max_position_embeddings=256,
        **({"sliding_window": None} if kind == "mistral" else {}),
        **extra,
    )
    return model_cls(config).eval()


def ids(B=2, T=40, seed=1):
    return torch.randint(0, 97, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_off_dense_and_full_topk_leave_logits_unchanged_and_sparse_paths_agree(kind):
    model = tiny(kind)
    x = ids()
    with torch.no_grad():
        ref = model(x).logits
        handle = attach_dsa(model, 3, 8, 16)
        for mode in ("off", "dense"):
            handle.set_mode(mode)
            assert torch.equal(model(x).logits, ref), mode
        handle.set_mode("sparse")
        handle.set_topk(x.shape[1])  # top-k >= L: every query selects everything it sees
        assert torch.equal(model(x).logits, ref)
        handle.set_topk(8)
        handle.config.sparse_impl = "gather"
        sparse = model(x).logits
        handle.config.sparse_impl = "masked"
        masked = model(x).logits
        assert not torch.allclose(sparse, ref, atol=1e-3)  # 8 of 40 keys really changes attention
        torch.testing.assert_close(sparse, masked, atol=2e-5, rtol=1e-5)
        detach_dsa(model)
        assert torch.equal(model(x).logits, ref)


def test_sparse_generation_with_a_cache_matches_the_full_forward():
    model = tiny("llama")
    handle = attach_dsa(model, 3, 8, 6, mode="sparse")
    prompt = ids(1, 12)
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=10, do_sample=False)
        full = model(out).logits.argmax(-1)
    assert torch.equal(full[0, 11:-1], out[0, 12:])
    assert handle.mode == "sparse"


@pytest.mark.parametrize("keyword", ["cache", "past_key_values"])
@pytest.mark.parametrize("mode", ["off", "sparse"])
def test_an_attached_layer_takes_its_cache_by_either_name_transformers_has_used(keyword, mode):
    from transformers import DynamicCache

    from dsv32.engine.backends import hf_index_keys

    model = tiny("llama")
    attach_dsa(model, 3, 8, 6, mode=mode)
    attn = model.model.layers[0].self_attn
    x = torch.randn(1, 10, 48)
    positions = torch.arange(10)[None]
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        out, _ = attn(x, model.model.rotary_emb(x, positions), None, **{keyword: cache})
    assert out.shape == (1, 10, 48)
    assert cache.get_seq_length(0) == 10  # K/V went into the cache, under either name
    assert (0 in hf_index_keys(cache)) == (mode == "sparse")  # and the indexer keys beside them


def test_losses_per_layer_and_only_for_chosen_layers():
    model = tiny("qwen3")
    handle = attach_dsa(model, 2, 8, 8, layers=[1])
    handle.collect_loss = True
    model(ids())
    losses = handle.pop_losses()
    assert list(losses) == [1] and losses[1].ndim == 0 and float(losses[1].detach()) > 0
    handle.set_mode("sparse")
    model(ids())
    assert float(handle.pop_losses()[1].detach()) >= 0
    assert not hasattr(model.model.layers[0].self_attn, "indexer")


def test_collected_loss_equals_eq3_on_the_layers_own_attention():
    model = tiny("llama")
    handle = attach_dsa(model, 3, 8, 16)
    model.config._attn_implementation = "eager"  # so the model returns its attention probabilities
    handle.collect_loss = True
    out = model(ids(), output_attentions=True)
    losses = handle.pop_losses()
    views = []
    with handle.observing(views.append), torch.no_grad():
        model(ids())
    for view in views:
        iq, ik = view.index_inputs()
        direct = indexer_kl_loss(out.attentions[view.layer_idx], index_scores(iq.q, iq.weights, ik))
        torch.testing.assert_close(losses[view.layer_idx], direct, rtol=1e-4, atol=1e-6)


def test_gradient_isolation_both_directions():
    model = tiny("llama")
    model.train()
    handle = attach_dsa(model, 3, 8, 8, mode="sparse")
    handle.collect_loss = True
    x = ids()
    logits = model(x).logits
    lm = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 97), x[:, 1:].reshape(-1))
    index_loss = sum(handle.pop_losses().values())
    idx_params = {id(p) for p in handle.indexer_parameters()}
    lm.backward(retain_graph=True)
    for name, p in model.named_parameters():
        if id(p) in idx_params:
            assert p.grad is None, name  # the LM loss never reaches the indexer
    assert any(p.grad is not None for p in model.parameters() if id(p) not in idx_params)
    model.zero_grad(set_to_none=True)
    index_loss.backward()
    for name, p in model.named_parameters():
        if id(p) not in idx_params:
            assert p.grad is None, name  # the indexer loss never reaches the model
        else:
            assert p.grad is not None, name


def test_save_load_round_trip(tmp_path):
    model = tiny("qwen2")
    handle = attach_dsa(model, 3, 8, 8, mode="sparse", seed=5)
    with torch.no_grad():
        for p in handle.indexer_parameters():
            p.add_(0.1)  # not the seeded init
        want = model(ids()).logits
    save_dsa(model, tmp_path / "full")
    again = load_dsa(tmp_path / "full")
    assert get_dsa(again).config.index_topk == 8 and get_dsa(again).mode == "sparse"
    with torch.no_grad():
        torch.testing.assert_close(again(ids()).logits, want)
    # Indexers only, into a fresh copy of the same base model.
    save_dsa(model, tmp_path / "indexers", save_base=False, base_ref="tiny-qwen2")
    fresh = load_dsa(tmp_path / "indexers", tiny("qwen2"))
    with torch.no_grad():
        torch.testing.assert_close(fresh(ids()).logits, want)
    with pytest.raises(DSAError, match="only the indexers"):
        load_dsa(tmp_path / "indexers")
    with pytest.raises(DSAError, match="saved from"):
        load_dsa(tmp_path / "indexers", tiny("llama"))


def test_bad_inputs_raise_typed_errors():
    model = tiny("llama")
    with pytest.raises(DSAError, match="mode"):
        attach_dsa(model, 2, 8, 8, mode="fast")
    with pytest.raises(DSAError, match="out of range"):
        attach_dsa(model, 2, 8, 8, layers=[5])
    with pytest.raises(DSAError, match="no DSA attached"):
        get_dsa(model)
    attach_dsa(model, 2, 8, 8)
    with pytest.raises(DSAError, match="already"):
        attach_dsa(model, 2, 8, 8)
    with pytest.raises(DSAError, match="families"):
        attach_dsa(torch.nn.Linear(2, 2), 2, 8, 8)


def test_sparse_training_takes_the_training_crossover_and_gives_the_gather_paths_gradients(monkeypatch):
    """With autograd a prefill of 40 tokens at top-8 (T/k = 5, above the inference crossover) runs
    masked-dense; the gradients are those of the gather path."""
    import dsv32.dsa.hf.forward as forward

    calls = []
    for name in ("dense_attention", "sparse_attention"):
        real = getattr(forward, name)
        monkeypatch.setattr(
            forward, name, lambda *a, _real=real, _name=name, **kw: calls.append(_name) or _real(*a, **kw)
        )
    model = tiny("llama")
    handle = attach_dsa(model, 3, 8, 16)
    handle.set_mode("sparse")
    handle.set_topk(8)
    x = ids()
    with torch.no_grad():
        model(x)
    assert calls == ["sparse_attention"] * 2  # inference: gathers
    grads = {}
    for impl in ("auto", "gather"):
        calls.clear()
        handle.config.sparse_impl = impl
        model.zero_grad(set_to_none=True)
        loss = model(x, labels=x).loss
        loss.backward()
        grads[impl] = (
            loss.detach(),
            {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
        )
        assert calls == ["dense_attention" if impl == "auto" else "sparse_attention"] * 2
    torch.testing.assert_close(grads["auto"][0], grads["gather"][0], atol=2e-5, rtol=1e-5)
    for name, g in grads["gather"][1].items():
        torch.testing.assert_close(grads["auto"][1][name], g, atol=2e-5, rtol=1e-4)
    monkeypatch.setattr("dsv32.dsa.attention.MASKED_TRAIN_MAX_PAIRS", 2 * 40 * 40 - 1)  # over the bound
    calls.clear()
    handle.config.sparse_impl = "auto"
    model(x, labels=x).loss.backward()
    assert calls == ["sparse_attention"] * 2


def test_the_warmup_loss_projects_indexer_queries_only_at_its_query_rows():
    """Dense warm-up: the KL loss reads the indexer's queries only at its query rows, so only those are
    projected — online and from a captured view — with the loss and gradients of the full projection."""
    from dsv32.dsa import indexer_kl_loss_chunked

    model = tiny("llama")
    handle = attach_dsa(model, 3, 8, 16)
    handle.set_mode("dense")
    x, rows = ids(), torch.tensor([3, 9, 17, 30, 39])
    seen = []
    for layer in model.model.layers:
        layer.self_attn.indexer.wq_b.register_forward_hook(lambda m, inp, out: seen.append(inp[0].shape[1]))
    views = []
    handle.collect_loss, handle.loss_query_rows = True, rows
    with handle.observing(views.append):
        model(x)
    online = handle.pop_losses()
    assert seen == [len(rows)] * 2  # not all 40 rows
    handle.collect_loss, handle.loss_query_rows = False, None
    for view in views:
        indexer = view.indexer
        params = list(indexer.parameters())
        seen.clear()
        loss = view.indexer_loss(query_rows=rows)
        assert seen == [len(rows)]
        got = torch.autograd.grad(loss, params)
        iq, ik = view.index_inputs()  # every row projected: the reference
        want_loss = indexer_kl_loss_chunked(
            view.q, view.k, iq.q, iq.weights, ik, scale=view.scale, query_rows=rows
        )
        want = torch.autograd.grad(want_loss, params)
        torch.testing.assert_close(loss, want_loss, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(online[view.layer_idx].detach(), want_loss, rtol=1e-6, atol=1e-7)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
