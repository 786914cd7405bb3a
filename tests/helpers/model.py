"""What the model tests share: a tiny V3.2 config, random token ids, an indexer top-k recorder."""

from __future__ import annotations

import torch

import dsv32.model.attention as mla_module
from dsv32.model import ModelConfig


def token_ids(T: int, B: int = 2, seed: int = 0, vocab: int = 128) -> torch.Tensor:
    """Random token ids ``[B, T]`` below ``vocab`` (the tiny reference model's vocabulary)."""
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


def record_indexer_topk(monkeypatch) -> list[tuple[tuple, dict, torch.Tensor]]:
    """Every ``indexer_topk`` call the model makes, as ``(args, kwargs, selection)``."""
    calls = []
    real = mla_module.indexer_topk

    def recording(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append((args, kwargs, out))
        return out

    monkeypatch.setattr(mla_module, "indexer_topk", recording)
    return calls


def tiny_config(**overrides) -> ModelConfig:
    """A two-layer V3.2 config (one dense layer, one MoE layer of 4 experts), plain RoPE."""
    base = dict(vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=2,
                first_k_dense_replace=1, num_attention_heads=2, n_routed_experts=4, n_group=2, topk_group=1,
                num_experts_per_tok=2, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
                v_head_dim=8, index_n_heads=2, index_head_dim=16, index_topk=4, rope_scaling=None)  # fmt: skip
    return ModelConfig(**{**base, **overrides})
