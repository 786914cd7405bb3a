"""Checkpoint I/O beyond the plain round trip: tied embeddings, malformed checkpoints, memory
ownership of the loaded weights, safe saving, FP8 scale grids."""

from __future__ import annotations

import torch
from hf_reference import make_hf_model
from model_helpers import tiny_config

from dsv32.model import DeepseekV32


def _same_state(a: DeepseekV32, b: DeepseekV32) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_tied_embeddings_round_trip_and_stay_tied(tmp_path):
    torch.manual_seed(0)
    model = DeepseekV32(tiny_config(tie_word_embeddings=True)).eval()
    model.save_pretrained(tmp_path)
    loaded = DeepseekV32.from_pretrained(tmp_path, dtype=torch.float32)
    assert _same_state(model, loaded)
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    ids = torch.randint(0, 64, (2, 7))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_transformers_tied_checkpoint_loads_tied(tmp_path):
    hf = make_hf_model(seed=0, tie_word_embeddings=True)
    hf.save_pretrained(tmp_path)
    ours = DeepseekV32.from_pretrained(tmp_path, dtype=torch.float32)
    assert ours.lm_head.weight.data_ptr() == ours.model.embed_tokens.weight.data_ptr()
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (ours(ids).logits - hf(ids).logits).abs().max() < 1e-4
