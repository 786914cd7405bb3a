"""RoPE parameters read from an HF config.json exactly as transformers' DeepseekV32Config reads them."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from helpers.hf_reference import TINY, make_hf_model

from dsv32.model import ConfigError, DeepseekV32, ModelConfig
from dsv32.model.rope import rope_inv_freq

BASE = {k: v for k, v in TINY.items() if k != "rope_parameters"}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "mscale_all_dim": 1.0}

# Every way a config.json may spell (or leave out) its RoPE parameters.
VARIANTS = {
    "no rope keys": {},
    "top-level rope_theta only": {"rope_theta": 50000.0},
    "v5 rope_parameters with rope_theta": {"rope_parameters": {**YARN, "rope_theta": 20000.0}},
    "v5 rope_parameters, top-level rope_theta": {"rope_parameters": YARN, "rope_theta": 50000.0},
    "v5 rope_theta inside wins": {"rope_parameters": {**YARN, "rope_theta": 20000.0}, "rope_theta": 5e4},
    "v5 rope_parameters without any rope_theta": {"rope_parameters": YARN},
    "v5 default rope_type": {"rope_parameters": {"rope_type": "default", "rope_theta": 50000.0}},
    "v5 empty rope_parameters": {"rope_parameters": {}},
    "v4 rope_scaling with type": {"rope_scaling": {"type": "yarn", "factor": 2.0,
                                                   "original_max_position_embeddings": 128}},
    "v4 rope_scaling wins over rope_parameters": {"rope_scaling": {**YARN, "factor": 2.0},
                                                  "rope_parameters": YARN},
    "empty rope_scaling falls back": {"rope_scaling": {}, "rope_parameters": YARN},
    "rope_type wins over type": {"rope_parameters": {**YARN, "type": "linear"}},
    "yarn without original length": {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}},
    "top-level original length wins": {"rope_parameters": YARN, "original_max_position_embeddings": 32},
    "yarn factor null": {"rope_parameters": {**YARN, "factor": None}},
    "yarn untruncated, betas, mscale": {"rope_parameters": {**YARN, "truncate": False, "beta_fast": 16,
                                                            "beta_slow": 2, "mscale": 0.8}},
}  # fmt: skip


@pytest.mark.parametrize("name", VARIANTS)
def test_rope_matches_transformers(name):
    from transformers import DeepseekV32Config
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import (
        DeepseekV32RotaryEmbedding,
        yarn_apply_mscale,
    )

    raw = {**BASE, **VARIANTS[name]}
    hf = DeepseekV32Config(**copy.deepcopy(raw))
    rotary = DeepseekV32RotaryEmbedding(hf)
    ours = ModelConfig.from_dict(copy.deepcopy(raw))
    inv_freq, amplitude = rope_inv_freq(ours.qk_rope_head_dim, ours.rope_theta, ours.rope_scaling)
    assert torch.allclose(inv_freq, rotary.inv_freq, rtol=1e-6, atol=0)
    assert amplitude == pytest.approx(rotary.attention_scaling)
    if not (hf.rope_parameters["rope_type"] == "yarn" and hf.rope_parameters["factor"] is None):
        expected = yarn_apply_mscale(hf.rope_parameters, hf.qk_head_dim**-0.5)  # needs a factor
        assert ours.softmax_scale == pytest.approx(expected)


def test_config_without_rope_keys_gives_transformers_logits(tmp_path):
    hf = make_hf_model(seed=0, rope_parameters=None)
    hf.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    for key in ("rope_parameters", "rope_scaling", "rope_theta"):
        cfg.pop(key, None)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    ours = DeepseekV32.from_pretrained(tmp_path, dtype=torch.float32)
    assert ours.config.rope_scaling is None
    ids = torch.randint(0, 128, (1, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (ours(ids).logits - hf(ids).logits).abs().max() < 1e-4


@pytest.mark.parametrize(
    ("rope", "field"),
    [
        ({"rope_parameters": "yarn"}, "rope_parameters"),
        ({"rope_scaling": "yarn"}, "rope_scaling"),
        ({"rope_scaling": [1, 2]}, "rope_scaling"),
        ({"rope_parameters": {"rope_type": "yarn", "original_max_position_embeddings": 64}}, "factor"),
        ({"rope_parameters": {**YARN, "factor": "4"}}, "rope_parameters.factor"),
        ({"rope_parameters": {**YARN, "beta_fast": "32"}}, "rope_parameters.beta_fast"),
        ({"rope_parameters": {**YARN, "original_max_position_embeddings": 64.5}}, "original_max_pos"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": None}}, "rope_theta"),
        ({"rope_theta": "10000"}, "rope_theta"),
        ({"rope_parameters": {"rope_type": "linear", "factor": 2.0}}, "linear"),
        ({"rope_parameters": {"indexed_attention": YARN}}, "per-layer"),
    ],
)
def test_malformed_rope_is_a_config_error_naming_the_field(rope, field):
    with pytest.raises(ConfigError, match=field):
        ModelConfig.from_dict({**BASE, **copy.deepcopy(rope)})


def test_saved_config_reads_back_the_same_rope():
    raw = {**BASE, "rope_parameters": {**YARN, "rope_theta": 20000.0, "truncate": False}}
    cfg = ModelConfig.from_dict(copy.deepcopy(raw))
    again = ModelConfig.from_dict(cfg.to_hf_dict())
    assert (again.rope_theta, again.rope_scaling) == (cfg.rope_theta, cfg.rope_scaling)
