"""Build a tiny transformers ``DeepseekV32ForCausalLM`` with every weight randomized (test-only)."""

from __future__ import annotations

import torch

TINY = dict(
    vocab_size=128,
    hidden_size=96,
    intermediate_size=160,
    moe_intermediate_size=48,
    num_hidden_layers=3,
    first_k_dense_replace=1,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_routed_experts=8,
    n_group=4,
    topk_group=2,
    num_experts_per_tok=2,
    n_shared_experts=1,
    routed_scaling_factor=2.5,
    q_lora_rank=48,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    index_n_heads=8,
    index_head_dim=32,
    index_topk=11,
    max_position_embeddings=256,
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
)


def make_hf_model(seed: int = 0, **overrides):
    """A random ``DeepseekV32ForCausalLM`` in eval mode, fp32, eager attention. Norm weights, the
    indexer LayerNorm and ``e_score_correction_bias`` are randomized too (not left at their init)."""
    from transformers import DeepseekV32Config, DeepseekV32ForCausalLM

    torch.manual_seed(seed)
    config = DeepseekV32Config(**{**TINY, **overrides})
    config._attn_implementation = "eager"
    model = DeepseekV32ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # norms and biases
                p.copy_(1.0 + 0.2 * torch.randn_like(p)) if name.endswith("weight") else p.normal_(0, 0.1)
            else:
                p.normal_(0.0, 0.08)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0.0, 0.1)
    return model
