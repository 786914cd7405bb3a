"""`generate` on Hugging Face causal LMs: tiny random Llama / Qwen2 / Qwen3 / Mistral models against
transformers' own `generate` and a full no-cache forward."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from helpers.engine import hf_families, tiny_hf  # noqa: E402

from dsv32.engine import generate, kept_logprobs, pad_prompts  # noqa: E402

FAMILIES = hf_families()
PROMPTS = [[5, 9, 12, 40, 7, 3, 22, 18, 30], [8, 4, 2], [60, 61, 62, 63, 64, 65]]


def tiny(kind: str = "llama", seed: int = 0):
    return tiny_hf(kind, seed)


@pytest.fixture(scope="module")
def llama():
    return tiny("llama")


def alone_logprobs(model, seq: torch.Tensor, prompt_len: int, new: torch.Tensor) -> torch.Tensor:
    """Log-softmax of one unpadded sequence's full no-cache forward at the generated tokens."""
    with torch.no_grad():
        logp = model(seq[None]).logits[0].float().log_softmax(-1)
    return logp[prompt_len - 1 : prompt_len - 1 + len(new)].gather(-1, new[:, None]).squeeze(-1)


@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_greedy_equals_transformers_generate_on_a_left_padded_ragged_batch(kind):
    model = tiny(kind)
    ids, mask = pad_prompts(PROMPTS, pad_token_id=0)
    with torch.no_grad():
        expected = model.generate(
            ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0, eos_token_id=None
        )[:, ids.shape[1] :]
    out = generate(model, ids, 16, temperature=0.0, attention_mask=mask, eos_token_id=[], pad_token_id=0)
    assert torch.equal(out.tokens, expected)
    assert torch.equal(out.sequences[:, : ids.shape[1]], ids)


def test_greedy_logprobs_are_the_full_forward_log_softmax(llama):
    out = generate(llama, PROMPTS, 12, temperature=0.0, eos_token_id=[])
    assert out.attention_mask.shape == out.sequences.shape
    for i, p in enumerate(PROMPTS):
        seq = out.sequences[i][out.attention_mask[i].bool()]
        assert torch.equal(seq[: len(p)], torch.tensor(p))
        expected = alone_logprobs(llama, seq, len(p), out.tokens[i])
        torch.testing.assert_close(out.logprobs[i], expected, rtol=0, atol=1e-5)


def test_a_left_padded_prompt_continues_as_it_does_alone(llama):
    positions = []  # RoPE only sees relative positions, so check what the model is given directly
    hook = llama.register_forward_pre_hook(
        lambda m, args, kwargs: positions.append(kwargs["position_ids"]), with_kwargs=True
    )
    try:
        batch = generate(llama, PROMPTS, 14, temperature=0.0, eos_token_id=[])
    finally:
        hook.remove()
    P = max(map(len, PROMPTS))
    for i, p in enumerate(PROMPTS):  # real tokens are numbered from 0 in every row, padding or not
        assert positions[0][i, P - len(p) :].tolist() == list(range(len(p)))
        assert [int(pos[i, 0]) for pos in positions[1:]] == list(range(len(p), len(p) + 13))
    for i, p in enumerate(PROMPTS):
        alone = generate(llama, [p], 14, temperature=0.0, eos_token_id=[])
        assert torch.equal(batch.tokens[i], alone.tokens[0])
        torch.testing.assert_close(batch.logprobs[i], alone.logprobs[0], rtol=0, atol=1e-5)


def test_eos_stops_a_row_which_then_leaves_the_batch(llama, monkeypatch):
    free = generate(llama, PROMPTS, 12, temperature=0.0, eos_token_id=[])
    eos = int(free.tokens[1, 2])
    assert [row.index(eos) if eos in row else None for row in free.tokens.tolist()] == [None, 2, None]
    batch_sizes = []  # (rows, positions) the LM head computes, per forward
    hook = llama.lm_head.register_forward_hook(lambda m, i, o: batch_sizes.append(tuple(i[0].shape[:2])))
    try:
        out = generate(llama, PROMPTS, 12, 0.0, eos_token_id=[eos, 256], pad_token_id=0, return_kept=True)
    finally:
        hook.remove()
    assert out.lengths.tolist() == [12, 3, 12]
    assert (out.tokens[1, 3:] == 0).all() and (out.logprobs[1, 3:] == 0).all()
    assert (out.attention_mask[1, -9:] == 0).all() and (out.attention_mask[1, -12:-9] == 1).all()
    assert (out.kept_token_ids[1, 3:] == -1).all() and out.kept_token_ids.shape == (3, 12, 1)
    for i in (0, 2):  # the other rows are unchanged by row 1 leaving the batch
        assert torch.equal(out.tokens[i], free.tokens[i])
        torch.testing.assert_close(out.logprobs[i], free.logprobs[i], rtol=0, atol=1e-5)
    # prefill computes the LM head on the last position only; row 1 leaves after its EOS (token 2)
    assert batch_sizes == [(3, 1)] * 3 + [(2, 1)] * 9
    # the default EOS is the generation config's (then the model config's)
    monkeypatch.setattr(llama.generation_config, "eos_token_id", eos)
    default = generate(llama, PROMPTS, 12, temperature=0.0, pad_token_id=0)
    assert torch.equal(default.tokens, out.tokens) and torch.equal(default.lengths, out.lengths)


def test_sampling_is_reproducible_and_its_logprobs_renormalize_over_the_kept_ids(llama):
    kw = dict(max_new_tokens=10, temperature=0.9, top_p=0.8, top_k=30, eos_token_id=[], return_kept=True)
    a = generate(llama, PROMPTS, generator=torch.Generator().manual_seed(0), **kw)
    b = generate(llama, PROMPTS, generator=torch.Generator().manual_seed(0), **kw)
    c = generate(llama, PROMPTS, generator=torch.Generator().manual_seed(1), **kw)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.logprobs, b.logprobs)
    assert torch.equal(a.kept_token_ids, b.kept_token_ids)
    assert not torch.equal(a.tokens, c.tokens)
    kept = a.kept_token_ids
    assert kept.shape[:2] == (3, 10) and 1 <= kept.shape[2] <= 30
    assert (kept == a.tokens[..., None]).sum(-1).eq(1).all()
    for i, p in enumerate(PROMPTS):
        seq = a.sequences[i][a.attention_mask[i].bool()]
        with torch.no_grad():
            logits = llama(seq[None]).logits[0, len(p) - 1 : -1]
        renorm = kept_logprobs(logits, kept[i], 0.9)
        at = (kept[i] == a.tokens[i, :, None]).int().argmax(-1, keepdim=True)
        torch.testing.assert_close(renorm.gather(-1, at).squeeze(-1), a.logprobs[i], rtol=0, atol=1e-5)


def test_dsa_attached_model_keeps_its_rows_and_matches_transformers():
    from dsv32.dsa import attach_dsa

    model = tiny("qwen3")
    attach_dsa(model, 2, 16, 4, mode="sparse")  # 4 of up to 20 keys: sparse attention in decode
    ids, mask = pad_prompts(PROMPTS, pad_token_id=0)
    with torch.no_grad():
        expected = model.generate(
            ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0, eos_token_id=None
        )[:, ids.shape[1] :]
    eos = int(expected[1, 2])
    out = generate(model, ids, 10, temperature=0.0, attention_mask=mask, eos_token_id=eos, pad_token_id=0)
    first = expected[1].tolist().index(eos)
    assert out.lengths[1] == first + 1
    for i in range(3):
        n = int(out.lengths[i])
        assert torch.equal(out.tokens[i, :n], expected[i, :n])


def test_hf_models_reject_routing_and_headless_models():
    model = tiny("llama")
    with pytest.raises(ValueError, match="return_routing"):
        generate(model, [[1, 2]], 2, return_routing=True)
    with pytest.raises(TypeError, match="AutoModelForCausalLM"):
        generate(model.model, [[1, 2]], 2)
    with pytest.raises(TypeError, match="DeepseekV32"):
        generate(torch.nn.Linear(2, 2), [[1, 2]], 2)


def test_a_session_on_a_dsa_model_reuses_its_cache_and_decodes_as_a_fresh_prefill():
    from dsv32.dsa import attach_dsa, get_dsa
    from dsv32.engine.sampling import SamplingParams
    from dsv32.engine.session import Session

    model = tiny("qwen3")
    attach_dsa(model, 2, 16, 4, mode="sparse")  # 4 keys of dozens: the selection matters
    greedy = SamplingParams(temperature=0.0)
    prompt = list(range(20, 60))
    kept = Session(model)
    first = kept.generate(prompt, max_new_tokens=6, sampling=greedy, stop_ids=[])
    longer = prompt + first.tokens + list(range(100, 115))
    again = kept.generate(longer, max_new_tokens=6, sampling=greedy, stop_ids=[])
    fresh = Session(model).generate(longer, max_new_tokens=6, sampling=greedy, stop_ids=[])
    assert (again.reused, again.prefilled) == (len(prompt) + 5, 16)
    assert again.tokens == fresh.tokens
    # a prompt that diverges earlier cuts the indexer keys back with the cache
    short = kept.generate([*prompt[:25], 7, 8], max_new_tokens=3, sampling=greedy, stop_ids=[])
    assert short.reused == 25
    assert (
        short.tokens
        == Session(model)
        .generate([*prompt[:25], 7, 8], max_new_tokens=3, sampling=greedy, stop_ids=[])
        .tokens
    )
    # a cache filled in dense mode holds no indexer keys: the next sparse call starts over
    handle = get_dsa(model)
    handle.set_mode("dense")
    kept.generate(prompt, max_new_tokens=2, sampling=greedy, stop_ids=[])
    handle.set_mode("sparse")
    after = kept.generate([*prompt, 9], max_new_tokens=2, sampling=greedy, stop_ids=[])
    assert (after.reused, after.prefilled) == (0, len(prompt) + 1)


def test_crop_hf_cache_cuts_the_indexer_keys_with_the_cache_and_crop_alone_is_refused():
    from transformers import DynamicCache

    from dsv32.dsa import DSAError, attach_dsa
    from dsv32.engine.backends import crop_hf_cache, hf_cache_keyword, hf_index_keys

    model = tiny("llama")
    attach_dsa(model, 2, 16, 4, mode="sparse")
    ids = torch.tensor([list(range(30, 60))])
    with torch.no_grad():
        full = model(ids).logits[0, -1]
        cache = DynamicCache(config=model.config)
        model(ids[:, :25], **{hf_cache_keyword(model): cache}, use_cache=True)
        cache.crop(-5)  # K/V only: the indexer keys of 25 tokens stay
        with pytest.raises(DSAError, match="crop_hf_cache"):
            model(ids[:, 20:], **{hf_cache_keyword(model): cache}, use_cache=True)
        cache = DynamicCache(config=model.config)
        model(ids[:, :25], **{hf_cache_keyword(model): cache}, use_cache=True)
        crop_hf_cache(cache, 20)
        assert cache.get_seq_length() == 20
        assert all(keys.shape[1] == 20 for keys in hf_index_keys(cache).values())
        out = model(ids[:, 20:], **{hf_cache_keyword(model): cache}, use_cache=True).logits[0, -1]
    torch.testing.assert_close(out, full, rtol=1e-4, atol=1e-4)
