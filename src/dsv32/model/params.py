"""Parameter accounting: total and per-token-active counts, on the meta device (no memory)."""

from __future__ import annotations

import torch

from dsv32.model.config import ModelConfig


def count_parameters(config: ModelConfig) -> dict[str, int]:
    """Build the model on the meta device and count parameters.

    ``active`` counts the weights one token computes with: everything except the routed experts it
    is not sent to (``n_routed_experts - num_experts_per_tok`` per MoE layer) and the input embedding
    table (a lookup reads one row). This is how DeepSeek's "671B total, 37B activated" is counted;
    the multi-token-prediction module is not part of this model.
    """
    from dsv32.model.moe import MoE
    from dsv32.model.transformer import DeepseekV32

    with torch.device("meta"):
        model = DeepseekV32(config)
    total = sum(p.numel() for p in model.parameters())
    inactive = 0
    indexer = 0
    for module in model.modules():
        if isinstance(module, MoE):
            per_expert = sum(p[0].numel() for p in module.experts.parameters())
            inactive += per_expert * (module.experts.num_experts - config.num_experts_per_tok)
    for layer in model.model.layers:
        indexer += sum(p.numel() for p in layer.self_attn.indexer.parameters())
    embedding = model.model.embed_tokens.weight.numel()
    return {"total": total, "active": total - inactive - embedding, "indexer": indexer}


def _human(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


def describe_parameters(config: ModelConfig) -> str:
    """A short human-readable report of :func:`count_parameters`."""
    c = count_parameters(config)
    return (
        f"layers {config.num_hidden_layers} (dense {config.first_k_dense_replace}, MoE {config.num_moe_layers}), "
        f"hidden {config.hidden_size}, heads {config.num_attention_heads}, "
        f"experts {config.n_routed_experts} routed + {config.n_shared_experts} shared "
        f"({config.num_experts_per_tok} active), index_topk {config.index_topk}\n"
        f"total parameters:            {c['total']:>16,d}  ({_human(c['total'])})\n"
        f"active parameters per token: {c['active']:>16,d}  ({_human(c['active'])})\n"
        f"lightning indexer:           {c['indexer']:>16,d}  ({_human(c['indexer'])})"
    )
