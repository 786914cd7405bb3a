"""The `dsv32 model ...` and `dsv32 generate` commands (thin wrappers, run in-process)."""

from __future__ import annotations

import json

import torch

from dsv32.cli import main
from dsv32.engine.speed import tiny_config
from dsv32.model import DeepseekV32


def test_model_info_on_the_reference_config(tmp_path, capsys):
    cfg = {"vocab_size": 129280, "dim": 7168, "inter_dim": 18432, "moe_inter_dim": 2048, "n_layers": 61,
           "n_dense_layers": 3, "n_heads": 128, "n_routed_experts": 256, "n_shared_experts": 1,
           "n_activated_experts": 8, "n_expert_groups": 8, "n_limited_groups": 4, "route_scale": 2.5,
           "score_func": "sigmoid", "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
           "qk_rope_head_dim": 64, "v_head_dim": 128, "index_n_heads": 64, "index_head_dim": 128,
           "index_topk": 2048}  # fmt: skip
    path = tmp_path / "config_671B_v3.2.json"
    path.write_text(json.dumps(cfg))
    assert main(["model", "info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "671.88B" in out and "37.48B" in out


def test_generate_from_a_checkpoint(tmp_path, capsys):
    torch.manual_seed(0)
    model = DeepseekV32(tiny_config()).eval()
    model.save_pretrained(tmp_path)
    assert (
        main(
            [
                "generate",
                str(tmp_path),
                "--prompt-ids",
                "5,6,7",
                "--max-new-tokens",
                "5",
                "--dtype",
                "float32",
            ]
        )
        == 0
    )
    printed = [int(t) for t in capsys.readouterr().out.strip().split(",")]
    assert len(printed) == 5
    from dsv32.engine import generate

    assert printed == generate(model, [[5, 6, 7]], max_new_tokens=5, temperature=0.0).tokens[0].tolist()


def test_tiny_demo_runs(tmp_path, capsys):
    assert main(["model", "demo", "--out", str(tmp_path), "--prompt-len", "128", "--new-tokens", "2"]) == 0
    out = capsys.readouterr().out
    assert "sparse (gather)" in out and (tmp_path / "model.safetensors").exists()
