"""Weight files for trainer → engine sync: every ``state_dict()`` key (a tied head too), a version
stamp, an atomic write, and a load that refuses a file that does not fit the model."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from safetensors import safe_open

from dsv32.engine.models import load_model
from dsv32.engine.weight_files import WeightFileError, file_version, load_weights, save_weights


def _tied():
    model = load_model("tiny-llama", device="cpu").model
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


def test_every_key_is_written_with_its_version_and_loads_back_exactly(tmp_path):
    src, dst = _tied(), _tied()
    with torch.no_grad():
        src.model.embed_tokens.weight.add_(1.0)  # the tied head moves with it
    path = save_weights(src, tmp_path / "w.safetensors", 12)
    with safe_open(str(path), framework="pt") as f:
        keys = set(f.keys())
    assert keys == set(src.state_dict()) and "lm_head.weight" in keys
    assert file_version(path) == 12
    assert [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]  # no temporary file left
    assert load_weights(dst, path) == 12
    assert all(torch.equal(v, src.state_dict()[k]) for k, v in dst.state_dict().items())
    assert dst.lm_head.weight.data_ptr() == dst.model.embed_tokens.weight.data_ptr()


def test_a_file_that_does_not_fit_is_refused_and_the_model_is_unchanged(tmp_path):
    model = _tied()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    other = load_model("tiny-native", device="cpu").model
    with pytest.raises(WeightFileError, match="does not match the served model"):
        load_weights(model, save_weights(other, tmp_path / "other.safetensors", 1))
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(WeightFileError, match="cannot read"):
        load_weights(model, tmp_path / "junk.safetensors")
    data = save_weights(model, tmp_path / "cut.safetensors", 2).read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) // 2])  # a copy cut short
    with pytest.raises(WeightFileError, match="cannot read"):
        load_weights(model, tmp_path / "cut.safetensors")
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
