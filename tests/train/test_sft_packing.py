"""Packing is exact: a packed row gives the loss and the gradients of its conversations trained one
by one, under every attention implementation it allows, sliding windows included; the others are
refused."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from dsv32.chat import add_v32_special_tokens
from dsv32.train.sft import loss_sum
from dsv32.train.sft.data import collate, encode_example
from dsv32.train.sft.model import SFTModel, SFTModelError, byte_level_tokenizer, prepare_sft_model

ROWS = [
    {"messages": [{"role": "user", "content": "hello there " * 3},
                  {"role": "assistant", "reasoning_content": "ok", "content": "hi! " * 5}]},
    {"messages": [{"role": "user", "content": "what?"},
                  {"role": "assistant", "reasoning_content": "hmm", "content": "nothing " * 4}]},
    {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "reasoning_content": "h", "content": "n"}]},
]  # fmt: skip


def _loss_and_grads(sm: SFTModel, examples, rows, packed: bool):
    sm.model.zero_grad(set_to_none=True)
    total = torch.zeros(())
    for row in rows:
        s, _ = loss_sum(sm, collate(examples, row, sm.pad_id), packed)
        s.backward()
        total += s.detach()
    grads = {k: p.grad.clone() for k, p in sm.model.named_parameters() if p.grad is not None}
    return total, grads


def _assert_packing_is_exact(sm: SFTModel) -> None:
    sm.model.eval()  # no dropout: both computations see the same function
    examples = [encode_example(sm.tokenizer, r) for r in ROWS]
    alone, g_alone = _loss_and_grads(sm, examples, [[[0]], [[1]], [[2]]], packed=False)
    # one batch of two rows: [0 | 1] and [2] right-padded, as training collates them
    packed, g_packed = _loss_and_grads(sm, examples, [[[0, 1], [2]]], packed=True)
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-4)
    assert g_packed.keys() == g_alone.keys()
    for k in g_alone:
        torch.testing.assert_close(g_packed[k], g_alone[k], rtol=1e-4, atol=1e-5, msg=k)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_a_packed_row_trains_exactly_as_its_conversations_alone(impl):
    sm = prepare_sft_model("tiny-llama", device="cpu")
    sm.model.set_attn_implementation(impl)
    _assert_packing_is_exact(sm)


def test_packing_is_exact_on_an_eager_sliding_window_model():
    """Gemma2 only runs eager attention, and its sliding window (16) is shorter than the rows."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    tok = byte_level_tokenizer()
    base = len(tok)
    add_v32_special_tokens(tok)
    config = Gemma2Config(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, sliding_window=16,
    )  # fmt: skip
    model = Gemma2ForCausalLM(config)
    assert model.config._attn_implementation == "eager"
    _assert_packing_is_exact(SFTModel(model, tok, "hf", [], "gemma2", base))


def test_packing_under_flash_attention_is_refused():
    sm = prepare_sft_model("tiny-llama", device="cpu")
    sm.model.config._attn_implementation = "flash_attention_2"
    examples = [encode_example(sm.tokenizer, r) for r in ROWS]
    with pytest.raises(SFTModelError, match=r"'flash_attention_2'.*data\.packing=false"):
        loss_sum(sm, collate(examples, [[0, 1]], sm.pad_id), True)
