"""DSA training under ``model.dtype = "bfloat16"`` (autocast): both stages run, the KL stays a KL."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("transformers")

from helpers.train import TINY_DSA, token_data

from dsv32.train import ModelSpec, StageConfig, load_dsa_model, train_stage


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-native"])
@pytest.mark.parametrize("loss_queries", [None, 10])
def test_warmup_and_sparse_steps_train_under_bf16_autocast(tmp_path, name, loss_queries):
    data = token_data(n=8)
    dm = load_dsa_model(ModelSpec(name=name, dtype="bfloat16"), TINY_DSA)
    assert dm.autocast_dtype == torch.bfloat16
    for stage in ("warmup", "sparse"):
        cfg = StageConfig(
            stage=stage, steps=2, batch_size=2, lr=1e-3, loss_queries=loss_queries,
            index_topk=8 if stage == "sparse" else None,
        )  # fmt: skip
        result = train_stage(dm, data, cfg, tmp_path / stage, progress=False, save_model=False)
        for m in result.metrics:
            assert math.isfinite(m["loss_indexer"]) and m["loss_indexer"] >= 0
            assert all(v >= 0 for v in m["layer_loss"])
            if stage == "sparse":
                assert math.isfinite(m["loss_lm"]) and math.isfinite(m["grad_norm_model"])
    assert all(p.dtype == torch.float32 and bool(torch.isfinite(p).all()) for p in dm.model.parameters())
