"""``train.new_token_lr``: only the rows of the tokens the run added move, in the embedding and in
an untied head; a model whose tokenizer has the V3.2 tokens already trains every row."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from dsv32.train.sft import load_sft_config, train_sft
from dsv32.train.sft.model import input_embeddings, prepare_sft_model


def _cfg(tmp_path, model: str, out: str, **over):
    data = tmp_path / "train.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": f"q{i}"},
                      {"role": "assistant", "reasoning_content": "r" * (i + 1), "content": f"a{i}"}]}
        for i in range(4)
    ]  # fmt: skip
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sets = {
        "model.name": model, "model.device": "cpu", "data.path": str(data), "data.seq_len": 256,
        "train.batch_size": 2, "train.steps": 2, "train.lr": 1e-3, "train.new_token_lr": 1e-2,
        "out_dir": str(tmp_path / out),
    } | over  # fmt: skip
    return load_sft_config(None, [f"{k}={json.dumps(v)}" for k, v in sets.items()])


def test_new_token_lr_keeps_the_pretrained_rows_of_an_untied_head(tmp_path):
    sm = prepare_sft_model("tiny-native", device="cpu")
    assert not sm.model.config.tie_word_embeddings and sm.base_vocab == 257
    embed0, head0 = input_embeddings(sm.model).detach().clone(), sm.model.lm_head.weight.detach().clone()
    train_sft(_cfg(tmp_path, "tiny-native", "run"), model=sm, progress=False, save_model=False)
    embed1, head1 = input_embeddings(sm.model).detach(), sm.model.lm_head.weight.detach()
    assert torch.equal(embed0[:257], embed1[:257]) and torch.equal(head0[:257], head1[:257])
    # both new-row blocks moved at new_token_lr (Adam: about 1e-2 per step), not at lr (1e-3)
    assert (embed1[257:] - embed0[257:]).abs().max() > 5e-3
    assert (head1[257:] - head0[257:]).abs().max() > 5e-3


def test_new_token_lr_freezes_nothing_when_the_tokenizer_has_the_tokens_already(tmp_path):
    """A second SFT on an SFT output: no token is added, so every embedding row trains at lr."""
    first = train_sft(_cfg(tmp_path, "tiny-llama", "first", **{"train.steps": 1}), progress=False)
    sm = prepare_sft_model(str(first.model_dir), device="cpu")
    assert sm.added_tokens == []
    before = input_embeddings(sm.model).detach().clone()
    train_sft(_cfg(tmp_path, "tiny-llama", "second"), model=sm, progress=False, save_model=False)
    after = input_embeddings(sm.model).detach()
    assert not torch.equal(before[:257], after[:257])  # pretrained rows learn
    assert not torch.equal(before[257:], after[257:])  # and the V3.2 tokens' rows
