"""Config parsing (both formats, errors), parameter counts, checkpoint I/O (sharding, FP8, MTP)."""

from __future__ import annotations

import json
import re

import pytest
import torch
from helpers.model import tiny_config
from safetensors.torch import load_file, save_file

from dsv32.model import (
    ConfigError,
    DeepseekV32,
    ModelConfig,
    count_parameters,
    dequantize_fp8_blocks,
    quantize_fp8_blocks,
)
from dsv32.model.rope import rope_inv_freq

# The released model's config.json (transformers v4 layout, as on the hub).
HF_671B = {
    "architectures": ["DeepseekV32ForCausalLM"],
    "model_type": "deepseek_v32",
    "vocab_size": 129280,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_nextn_predict_layers": 1,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_shared_experts": 1,
    "n_routed_experts": 256,
    "routed_scaling_factor": 2.5,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "qk_nope_head_dim": 128,
    "topk_method": "noaux_tc",
    "n_group": 8,
    "topk_group": 4,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "norm_topk_prob": True,
    "scoring_func": "sigmoid",
    "max_position_embeddings": 163840,
    "rope_theta": 10000,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "index_topk": 2048,
    "index_head_dim": 128,
    "index_n_heads": 64,
    "rms_norm_eps": 1e-06,
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
}

# DeepSeek's reference inference config (inference/config_671B_v3.2.json).
REFERENCE_671B = {
    "vocab_size": 129280, "dim": 7168, "inter_dim": 18432, "moe_inter_dim": 2048, "n_layers": 61,
    "n_dense_layers": 3, "n_heads": 128, "n_routed_experts": 256, "n_shared_experts": 1,
    "n_activated_experts": 8, "n_expert_groups": 8, "n_limited_groups": 4, "route_scale": 2.5,
    "score_func": "sigmoid", "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "dtype": "fp8", "scale_fmt": "ue8m0",
    "index_n_heads": 64, "index_head_dim": 128, "index_topk": 2048,
}  # fmt: skip


def test_both_config_formats_describe_the_same_model(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(HF_671B))
    (tmp_path / "ref.json").write_text(json.dumps(REFERENCE_671B))
    hf = ModelConfig.from_pretrained(tmp_path / "hf")
    ref = ModelConfig.from_pretrained(tmp_path / "ref.json")
    for name in ("hidden_size", "num_hidden_layers", "first_k_dense_replace", "num_experts_per_tok", "n_group",
                 "topk_group", "routed_scaling_factor", "scoring_func", "topk_method", "norm_topk_prob",
                 "q_lora_rank", "index_topk", "index_n_heads"):  # fmt: skip
        assert getattr(hf, name) == getattr(ref, name), name
    assert hf.softmax_scale == pytest.approx(ref.softmax_scale)
    # YaRN with factor 40 and mscale 1: scale = 192^-0.5 * (0.1 ln 40 + 1)^2
    assert hf.softmax_scale == pytest.approx(
        192**-0.5 * (0.1 * torch.log(torch.tensor(40.0)).item() + 1) ** 2
    )
    f_hf, a_hf = rope_inv_freq(64, hf.rope_theta, hf.rope_scaling)
    f_ref, a_ref = rope_inv_freq(64, ref.rope_theta, ref.rope_scaling)
    assert torch.equal(f_hf, f_ref) and a_hf == a_ref == 1.0


def test_yarn_frequencies_match_transformers():
    from transformers import DeepseekV32Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = ModelConfig.from_dict(HF_671B)
    hf_cfg = DeepseekV32Config(**ModelConfig.from_dict(HF_671B).to_hf_dict())
    expected, amplitude = ROPE_INIT_FUNCTIONS["yarn"](hf_cfg)
    got, got_amplitude = rope_inv_freq(64, cfg.rope_theta, cfg.rope_scaling)
    assert torch.allclose(got, expected, rtol=1e-6) and got_amplitude == pytest.approx(amplitude)


def test_full_model_parameter_counts_on_meta():
    counts = count_parameters(ModelConfig.from_dict(HF_671B))
    assert 665e9 < counts["total"] < 680e9  # "671B total"
    assert 36.5e9 < counts["active"] < 38e9  # "37B activated"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"hidden_size": None}, "hidden_size"),
        ({"n_group": 3}, "n_group"),
        ({"topk_group": 9}, "topk_group"),
        ({"num_experts_per_tok": 300}, "num_experts_per_tok"),
        ({"qk_rope_head_dim": 63}, "qk_rope_head_dim"),
        ({"first_k_dense_replace": 99}, "first_k_dense_replace"),
        ({"num_key_value_heads": 8}, "num_key_value_heads"),
        ({"scoring_func": "relu"}, "scoring_func"),
        ({"index_head_dim": 32}, "index_head_dim"),
        # values of the wrong type
        ({"n_routed_experts": "256"}, "n_routed_experts='256'"),
        ({"q_lora_rank": "1536"}, "q_lora_rank='1536'"),
        ({"n_group": None}, "n_group=None"),
        ({"first_k_dense_replace": None}, "first_k_dense_replace=None"),
        ({"num_hidden_layers": True}, "num_hidden_layers=True"),
        ({"rms_norm_eps": "1e-6"}, "rms_norm_eps='1e-6'"),
        ({"routed_scaling_factor": [2.5]}, "routed_scaling_factor"),
        ({"norm_topk_prob": "yes"}, "norm_topk_prob='yes'"),
        ({"eos_token_id": "x"}, "eos_token_id='x'"),
        ({"eos_token_id": [1, "x"]}, "eos_token_id"),
        ({"rope_scaling": "yarn"}, "rope_scaling='yarn'"),
        ({"topk_method": "bogus"}, "topk_method='bogus'"),
        ({"topk_method": "greedy"}, "topk_method='greedy'"),  # group-limited config
    ],
)
def test_config_errors_name_the_field(change, field):
    raw = {**HF_671B, **change}
    if change.get("hidden_size", 0) is None:
        del raw["hidden_size"]
    with pytest.raises(ConfigError, match=re.escape(field)):
        ModelConfig.from_dict(raw)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"n_routed_experts": "256"}, "n_routed_experts='256'"),
        ({"rope_factor": "40"}, "rope_factor='40'"),
        ({"max_seq_len": None}, "max_seq_len=None"),
        ({"original_seq_len": 4096.5}, "original_seq_len=4096.5"),
    ],
)
def test_reference_config_errors_name_the_field(change, field):
    with pytest.raises(ConfigError, match=re.escape(field)):
        ModelConfig.from_dict({**REFERENCE_671B, **change})


def test_reference_config_defaults_are_the_reference_model_args():
    """What a reference config leaves out takes DeepSeek's ModelArgs default, not the HF 671B value."""
    kept = ("vocab_size", "dim", "inter_dim", "n_layers", "n_heads", "kv_lora_rank", "qk_nope_head_dim",
            "qk_rope_head_dim", "v_head_dim", "index_n_heads", "index_head_dim", "index_topk")  # fmt: skip
    cfg = ModelConfig.from_dict({k: REFERENCE_671B[k] for k in kept})
    assert (cfg.n_routed_experts, cfg.n_shared_experts, cfg.num_experts_per_tok) == (64, 2, 6)
    assert (cfg.moe_intermediate_size, cfg.first_k_dense_replace, cfg.q_lora_rank) == (1408, 1, None)
    assert (cfg.n_group, cfg.topk_group, cfg.routed_scaling_factor) == (1, 1, 1.0)
    assert (cfg.scoring_func, cfg.topk_method, cfg.norm_topk_prob) == (
        "softmax",
        "group_limited_greedy",
        False,
    )
    assert cfg.max_position_embeddings == 16384 and cfg.rope_scaling["factor"] == 40


def test_missing_required_field_is_named():
    raw = {k: v for k, v in HF_671B.items() if k != "kv_lora_rank"}
    with pytest.raises(ConfigError, match="kv_lora_rank"):
        ModelConfig.from_dict(raw)


def test_save_load_round_trip_is_exact_and_sharded(tmp_path):
    torch.manual_seed(0)
    model = DeepseekV32(tiny_config())
    model.save_pretrained(tmp_path / "one")
    model.save_pretrained(tmp_path / "many", max_shard_size=20_000)
    assert (tmp_path / "many" / "model.safetensors.index.json").exists()
    assert len(list((tmp_path / "many").glob("model-*.safetensors"))) > 1
    keys = set(load_file(tmp_path / "one" / "model.safetensors"))
    assert "model.layers.1.mlp.experts.3.down_proj.weight" in keys  # HF per-expert names
    for sub in ("one", "many"):
        loaded = DeepseekV32.from_pretrained(tmp_path / sub, dtype=torch.float32)
        for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
            assert torch.equal(a, b), name


def test_checkpoint_loads_into_transformers(tmp_path):
    from transformers import DeepseekV32ForCausalLM

    torch.manual_seed(0)
    model = DeepseekV32(tiny_config(rope_scaling=None)).eval()
    model.save_pretrained(tmp_path)
    hf = DeepseekV32ForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ids = torch.randint(0, 64, (1, 9))
    with torch.no_grad():
        assert (hf(ids).logits - model(ids).logits).abs().max() < 1e-4


def test_fp8_block_dequantization_round_trip():
    torch.manual_seed(0)
    w = torch.randn(300, 200) * torch.logspace(-2, 1, 200)  # blocks of very different magnitude
    q, scale_inv = quantize_fp8_blocks(w)
    assert q.dtype == torch.float8_e4m3fn and scale_inv.shape == (3, 2)
    back = dequantize_fp8_blocks(q, scale_inv)
    # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 for normal values, in every block
    assert (
        (back - w).abs()
        <= w.abs() / 16 + scale_inv.repeat_interleave(128, 0)[:300].repeat_interleave(128, 1)[:, :200] * 2**-9
    ).all()
    q2, s2 = quantize_fp8_blocks(back)
    assert torch.equal(dequantize_fp8_blocks(q2, s2), back)  # idempotent on representable values


def test_fp8_checkpoint_and_mtp_layers(tmp_path, caplog):
    torch.manual_seed(0)
    model = DeepseekV32(tiny_config())
    model.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    fp8 = {}
    for name, t in state.items():
        if t.dim() == 2 and "embed" not in name and "norm" not in name:
            fp8[name], fp8[name + "_scale_inv"] = quantize_fp8_blocks(t)
        else:
            fp8[name] = t
    fp8["model.layers.2.eh_proj.weight"] = torch.zeros(4, 4)  # an MTP layer (index == num_hidden_layers)
    save_file(fp8, tmp_path / "model.safetensors")
    with caplog.at_level("INFO"):
        loaded = DeepseekV32.from_pretrained(tmp_path, dtype=torch.float32)
    assert "multi-token-prediction" in caplog.text
    w = loaded.model.layers[0].self_attn.q_a_proj.weight
    name = "model.layers.0.self_attn.q_a_proj.weight"
    assert torch.equal(w, dequantize_fp8_blocks(fp8[name], fp8[name + "_scale_inv"]))
    ids = torch.randint(0, 64, (1, 12))
    with torch.no_grad():
        assert (loaded(ids).logits - model(ids).logits).abs().max() < 0.05


def test_bf16_load_keeps_router_bias_and_indexer_gates_fp32(tmp_path):
    DeepseekV32(tiny_config()).save_pretrained(tmp_path)
    m = DeepseekV32.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert m.model.layers[1].mlp.gate.e_score_correction_bias.dtype == torch.float32
    assert m.model.layers[0].self_attn.indexer.weights_proj.weight.dtype == torch.float32
    assert m.model.layers[0].self_attn.q_a_proj.weight.dtype == torch.bfloat16
    assert torch.isfinite(m(torch.randint(0, 64, (1, 10))).logits).all()


def test_plain_q_projection_without_q_lora(tmp_path):
    torch.manual_seed(0)
    model = DeepseekV32(tiny_config(q_lora_rank=None)).eval()
    assert hasattr(model.model.layers[0].self_attn, "q_proj")
    ids = torch.randint(0, 64, (2, 14))
    with torch.no_grad():
        full = model(ids).logits
        cache = model.new_cache(2, 14)
        steps = [model(ids[:, :3], cache=cache).logits] + [model(ids[:, t : t + 1], cache=cache).logits
                                                           for t in range(3, 14)]  # fmt: skip
    assert (torch.cat(steps, 1) - full).abs().max() < 1e-4
    model.save_pretrained(tmp_path)
    assert torch.equal(
        DeepseekV32.from_pretrained(tmp_path, dtype=torch.float32)(ids).logits, model(ids).logits
    )


def test_a_config_of_another_architecture_is_refused_by_name(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "num_attention_heads": 9, "num_key_value_heads": 3}))
    with pytest.raises(ConfigError, match="'llama' config, not DeepSeek"):
        ModelConfig.from_pretrained(path)
