"""Fixtures: a random transformers DeepseekV32ForCausalLM saved to disk and our model loaded from it."""

from __future__ import annotations

import pytest
import torch
from helpers.hf_reference import make_hf_model


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory):
    """``(hf_model, checkpoint_dir)``: the reference model and its ``save_pretrained`` output."""
    model = make_hf_model(seed=0)
    path = tmp_path_factory.mktemp("tiny_v32")
    model.save_pretrained(path)
    return model, path


@pytest.fixture(scope="session")
def ours(hf_checkpoint):
    from dsv32.model import DeepseekV32

    return DeepseekV32.from_pretrained(hf_checkpoint[1], dtype=torch.float32)


@pytest.fixture
def fresh_ours(hf_checkpoint):
    """A private copy for tests that change the model's modes."""
    from dsv32.model import DeepseekV32

    return DeepseekV32.from_pretrained(hf_checkpoint[1], dtype=torch.float32)
