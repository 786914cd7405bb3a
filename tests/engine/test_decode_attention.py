"""The engine's attention for transformers models (``dsv32.engine.attention``): a one-token step with
the query heads packed per key/value head computes what transformers' ``sdpa`` computes, masked or
not; every other call is ``sdpa`` itself; the switch is scoped to the engine's calls; generation
through the engine gives transformers' own greedy tokens."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from transformers.integrations.sdpa_attention import sdpa_attention_forward

from dsv32.engine import generate
from dsv32.engine.attention import NAME, decode_attention, engine_attention
from dsv32.engine.models import load_model, tiny_llama_config

pytestmark = pytest.mark.usefixtures("one_thread")


class Layer(torch.nn.Module):
    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def _inputs(B: int, H: int, H_kv: int, T: int, S: int, dtype=torch.float32, padded: bool = True):
    g = torch.Generator().manual_seed(B * 100 + T)
    q = torch.randn(B, H, T, 16, generator=g).to(dtype)
    # the cache: views of a buffer with headroom, as the engine's growing cache hands them out
    k = torch.randn(B, H_kv, S + 7, 16, generator=g).to(dtype)[:, :, :S]
    v = torch.randn(B, H_kv, S + 7, 16, generator=g).to(dtype)[:, :, :S]
    mask = None
    if padded:
        mask = torch.ones(B, 1, T, S, dtype=torch.bool).tril(S - T)
        mask[1:, ..., : S // 3] = False  # left padding of the later rows
    return q, k, v, mask


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize(("H", "H_kv"), [(8, 2), (6, 3), (4, 4)])
@torch.no_grad()
def test_a_decode_step_computes_what_sdpa_computes(H, H_kv, padded):
    q, k, v, mask = _inputs(3, H, H_kv, 1, 21, padded=padded)
    layer = Layer(H // H_kv)
    ours, _ = engine_attention(layer, q, k, v, mask, scaling=0.25)
    theirs, _ = sdpa_attention_forward(layer, q, k, v, mask, scaling=0.25)
    assert ours.shape == theirs.shape == (3, 1, H, 16)
    torch.testing.assert_close(ours, theirs, atol=2e-6, rtol=0)
    # and what attention is by its definition: softmax(q k^T · scale) v over the visible keys
    G = H // H_kv
    scores = (q @ k.repeat_interleave(G, 1).transpose(-1, -2)) * 0.25
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    exact = (scores.softmax(-1) @ v.repeat_interleave(G, 1)).transpose(1, 2)
    torch.testing.assert_close(ours, exact, atol=2e-6, rtol=0)


@pytest.mark.parametrize("padded", [False, True])
@torch.no_grad()
def test_where_the_cpu_kernels_are_built_a_bf16_decode_step_runs_the_dense_decode_kernel(padded, monkeypatch):
    from dsv32.dsa.kernels import cpu

    if not cpu.available():
        pytest.skip("no CPU kernels here (no C compiler)")
    calls, original = [], cpu.decode_gqa_attention_cpu
    monkeypatch.setattr(cpu, "decode_gqa_attention_cpu", lambda *a: calls.append(a) or original(*a))
    q, k, v, mask = _inputs(3, 6, 2, 1, 21, dtype=torch.bfloat16, padded=padded)
    layer = Layer(3)
    ours, _ = engine_attention(layer, q, k, v, mask)  # no scaling given: SDPA's 1/sqrt(D)
    assert len(calls) == 1 and ours.dtype == torch.bfloat16
    exact, _ = sdpa_attention_forward(layer, q.float(), k.float(), v.float(), mask)
    torch.testing.assert_close(
        ours.float(), exact, atol=2e-6, rtol=2**-8
    )  # fp32 arithmetic, one bf16 rounding
    # fp32 steps keep SDPA's packed call: the same bits with the kernels on or off
    q, k, v = q.float(), k.float(), v.float()
    on, _ = engine_attention(layer, q, k, v, mask)
    with cpu.enabled(False):
        off, _ = engine_attention(layer, q, k, v, mask)
    assert len(calls) == 1
    assert torch.equal(on, off)


@torch.no_grad()
def test_in_bfloat16_the_decode_step_stays_within_bfloat16_rounding_of_float32():
    q, k, v, mask = _inputs(2, 6, 2, 1, 40, torch.bfloat16)
    layer = Layer(3)
    ours, _ = engine_attention(layer, q, k, v, mask, scaling=0.25)
    exact, _ = sdpa_attention_forward(layer, q.float(), k.float(), v.float(), mask, scaling=0.25)
    assert ours.dtype == torch.bfloat16
    torch.testing.assert_close(ours.float(), exact, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("case", ["prefill", "chunk", "gradients", "dropout"])
def test_every_other_call_is_sdpa_itself(case):
    T = {"prefill": 9, "chunk": 3}.get(case, 1)
    q, k, v, mask = _inputs(2, 4, 2, T, 12)
    layer = Layer(2)
    kwargs = {"dropout": 0.5} if case == "dropout" else {}
    with torch.set_grad_enabled(case == "gradients"):
        torch.manual_seed(0)
        ours, _ = engine_attention(layer, q, k, v, mask, scaling=0.25, **kwargs)
        torch.manual_seed(0)
        theirs, _ = sdpa_attention_forward(layer, q, k, v, mask, scaling=0.25, **kwargs)
    assert torch.equal(ours, theirs)


def test_the_switch_is_scoped_to_the_engines_calls():
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(tiny_llama_config())
    assert model.config._attn_implementation == "sdpa"
    with decode_attention(model):
        assert model.config._attn_implementation == NAME
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError), decode_attention(model):
        raise RuntimeError("a forward that fails")
    assert model.config._attn_implementation == "sdpa"
    eager = LlamaForCausalLM(tiny_llama_config(attn_implementation="eager"))
    with decode_attention(eager):
        assert eager.config._attn_implementation == "eager"  # only sdpa is replaced


@torch.no_grad()
def test_batched_generation_gives_transformers_own_greedy_tokens():
    loaded = load_model("tiny-llama", device="cpu")
    model = loaded.model.eval()
    prompts = [[72, 101, 108, 108, 111], [87, 111], [84, 104, 101, 32, 99, 97, 116]]
    out = generate(model, prompts, max_new_tokens=12, temperature=0.0, eos_token_id=[])
    for i, p in enumerate(prompts):
        ids = torch.tensor([p])
        theirs = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False, eos_token_id=None
        )[0, len(p) :]
        assert out.tokens[i].tolist() == theirs.tolist()
    # the log-probs the engine reports are the full forward's over the generated text
    full = torch.cat((torch.tensor(prompts[2]), out.tokens[2]))[None]
    logp = model(full).logits[0, len(prompts[2]) - 1 : -1].log_softmax(-1)
    expected = logp.gather(-1, out.tokens[2][:, None])[:, 0]
    torch.testing.assert_close(out.logprobs[2], expected, atol=1e-5, rtol=0)
