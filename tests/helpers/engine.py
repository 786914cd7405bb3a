"""Tiny models for the engine tests: random transformers causal LMs and a native V3.2 model."""

from __future__ import annotations

import torch

from dsv32.model import DeepseekV32, ModelConfig


def hf_families() -> dict:
    import transformers

    return {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }


def tiny_hf(kind: str = "llama", seed: int = 0, **overrides):
    """A 2-layer random model of ``kind`` with peaky logits (greedy choices are not decided by
    rounding), no EOS/pad/BOS ids; ``overrides`` go to its config."""
    config_cls, model_cls = hf_families()[kind]
    torch.manual_seed(seed)
    settings = dict(
        vocab_size=257, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2, eos_token_id=None,
        pad_token_id=None, bos_token_id=None, **({"sliding_window": None} if kind == "mistral" else {}),
    )  # fmt: skip
    return model_cls(config_cls(**(settings | overrides))).eval()


def tiny_native() -> DeepseekV32:
    """A 3-layer native V3.2 model (MoE, DSA indexer) with peaky logits; EOS id 1."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=96, hidden_size=48, intermediate_size=64, moe_intermediate_size=24, num_hidden_layers=3,
        first_k_dense_replace=1, num_attention_heads=4, n_routed_experts=8, n_group=4, topk_group=2,
        num_experts_per_tok=2, q_lora_rank=32, kv_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=8,
        v_head_dim=8, index_n_heads=4, index_head_dim=16, index_topk=8, rope_scaling=None, eos_token_id=1,
    )  # fmt: skip
    m = DeepseekV32(cfg).eval()
    m.init_weights(std=0.3)  # peaky logits so that greedy decoding is not decided by rounding
    return m


def tiny_llama():
    """A tiny random Llama with a 512-token window."""
    return tiny_hf("llama", max_position_embeddings=512)


def tiny_dsa_llama():
    """:func:`tiny_llama` with DSA attached in sparse mode, 4 keys of dozens (kept indexer keys matter)."""
    from dsv32.dsa import attach_dsa

    model = tiny_llama()
    attach_dsa(model, 2, 16, 4, mode="sparse")
    return model


#: The three kinds of cache a prefix is kept from: transformers', the native one, and DSA's beside K/V.
PREFIX_MODELS = {"llama": tiny_llama, "native": tiny_native, "llama+dsa": tiny_dsa_llama}
