"""The engine's decode step for Llama-family models (``dsv32.engine.fastdecode``): the logits of
transformers' forward (to the bit with unpacked weights, to rounding with oneDNN-packed ones), on
left-padded batches, after a weight changes in place, with biases (Qwen2) and in bf16; which models
it takes; and generation through it."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from transformers import LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from dsv32.engine import fastdecode, generate
from dsv32.engine.attention import decode_attention
from dsv32.engine.backends import HFBackend, pad_prompts
from dsv32.engine.models import tiny_llama_config

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[72, 101, 108, 108, 111, 32], [87, 111], [84, 104, 101, 32, 99, 97, 116, 33, 10]]


def _tiny_qwen2(**overrides):
    values = dict(vocab_size=257, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)  # fmt: skip
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(**(values | overrides))).eval()


def _tiny_llama(dtype=torch.float32):
    torch.manual_seed(0)
    return LlamaForCausalLM(tiny_llama_config()).eval().to(dtype)


@torch.no_grad()
def _both(model, prompts, steps: int = 3, packed: bool = True, monkeypatch=None):
    """Prefill ``prompts`` (left-padded) twice, then feed the same tokens ``steps`` times to
    transformers' forward and to :func:`fastdecode.decode_step`; the logits of each step."""
    if not packed:
        monkeypatch.setenv("DSV32_PACKED_WEIGHTS", "0")
        fastdecode._packed.pop(model, None)
    ours, theirs = HFBackend(model), HFBackend(model)
    ids, mask = pad_prompts(prompts, 0)
    ours.prefill(ids, mask, 64)
    logits = theirs.prefill(ids, mask, 64)
    g = torch.Generator().manual_seed(0)
    got, want = [], []
    for _ in range(steps):
        tokens = torch.randint(0, model.config.vocab_size, (len(prompts),), generator=g)
        mask = torch.cat((mask, torch.ones_like(mask[:, :1])), dim=1)
        got.append(fastdecode.decode_step(model, ours.cache, tokens, mask))
        want.append(theirs._forward(tokens[:, None], mask))
    return torch.stack(got), torch.stack(want), logits


@pytest.mark.parametrize("prompts", [PROMPTS, [PROMPTS[0], PROMPTS[0]]], ids=["padded", "unpadded"])
def test_unpacked_it_is_transformers_forward_to_the_bit(prompts, monkeypatch):
    got, want, _ = _both(_tiny_llama(), prompts, packed=False, monkeypatch=monkeypatch)
    assert torch.equal(got, want)


def test_with_packed_weights_it_is_transformers_forward_to_rounding():
    model = _tiny_llama()
    assert fastdecode.packed_weights(model) is not None
    got, want, _ = _both(model, PROMPTS)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=0)


@torch.no_grad()
def test_a_weight_changed_in_place_is_packed_again():
    model = _tiny_llama()
    _both(model, PROMPTS, steps=1)  # packs the weights
    packed = fastdecode.packed_weights(model)
    before = dict(packed.copies)
    for p in model.parameters():  # an optimizer step: every weight changes in place
        p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.05)
    got, want, _ = _both(model, PROMPTS)
    assert fastdecode.packed_weights(model) is packed
    assert all(packed.copies[k][1] != before[k][1] for k in before)  # packed again, at the new versions
    torch.testing.assert_close(got, want, atol=2e-5, rtol=0)


@torch.no_grad()
def test_qwen2_with_its_biases_also_after_they_change():
    model = _tiny_qwen2()
    assert fastdecode.supported(model)
    got, want, _ = _both(model, PROMPTS)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
    for layer in model.model.layers:  # only the biases move
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
            proj.bias.add_(0.5)
    got, want, _ = _both(model, PROMPTS)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=0)


@pytest.mark.parametrize("rows", [1, 3, 6])
def test_in_bfloat16_every_row_count_stays_within_bf16_rounding(rows):
    model = _tiny_llama(torch.bfloat16)
    prompts = (PROMPTS * 2)[:rows]
    got, want, _ = _both(model, prompts)
    assert got.dtype == torch.bfloat16 and got.shape[1] == rows
    exact, _, _ = _both(_tiny_llama(), prompts)
    err = (got.float() - exact).abs().max()
    assert err <= 2 * (want.float() - exact).abs().max() + 0.02  # no worse than transformers' own bf16


def test_which_models_it_takes():
    model = _tiny_llama()
    assert fastdecode.supported(model)
    model.train()
    assert not fastdecode.supported(model)  # a model in training mode runs its own forward
    model.eval()
    handle = model.model.layers[0].mlp.register_forward_hook(lambda *a: None)
    assert not fastdecode.supported(model)  # a hook (FSDP, a profiler, ...) must run
    handle.remove()
    assert fastdecode.supported(model)

    class LoraLike(torch.nn.Linear):
        pass

    proj = model.model.layers[1].self_attn.q_proj
    model.model.layers[1].self_attn.q_proj = LoraLike(proj.in_features, proj.out_features, bias=False)
    assert not fastdecode.supported(model)  # a replaced layer (peft's LoRA) computes something else
    assert not fastdecode.supported(
        _tiny_qwen2(use_sliding_window=True, sliding_window=4, max_window_layers=0)
    )


def test_a_dsa_attached_model_runs_its_own_forward():
    from dsv32.dsa.hf import attach_dsa

    model = _tiny_llama()
    attach_dsa(model, index_topk=4)
    assert not fastdecode.supported(model)
    assert not HFBackend(model).fast_decode


@torch.no_grad()
def test_generation_through_it_gives_transformers_greedy_tokens():
    model = _tiny_llama()
    assert HFBackend(model).fast_decode
    out = generate(model, PROMPTS, max_new_tokens=10, temperature=0.0, eos_token_id=[])
    for i, p in enumerate(PROMPTS):
        ids = torch.tensor([p])
        with decode_attention(model):
            theirs = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=10,
                do_sample=False,
                eos_token_id=None,
            )[0, len(p) :]
        assert out.tokens[i].tolist() == theirs.tolist()
