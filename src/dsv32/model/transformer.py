"""The DeepSeek-V3.2 network: embedding → N × (MLA+DSA, dense MLP or DeepSeekMoE) → norm → LM head.

Module and parameter names equal the Hugging Face checkpoint's (``model.layers.{i}.self_attn.…``),
so checkpoint I/O is a plain state-dict load. The model knows nothing of training loops or sampling.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from dsv32.dsa import SPARSE_IMPLS
from dsv32.dsa.fp8 import SCALE_FORMATS
from dsv32.dsa.keep import (
    IndexingError,
    dense_positions,
    key_positions,
    pad_slots,
    row_offsets,
    to_columns,
    to_positions,
)
from dsv32.model.attention import DSA_MODES, MLA
from dsv32.model.cache import KVCache
from dsv32.model.checkpoint import load_pretrained, save_pretrained
from dsv32.model.config import ModelConfig
from dsv32.model.layers import MLP, RMSNorm
from dsv32.model.moe import MoE
from dsv32.model.rope import RotaryEmbedding


@dataclass
class ModelOutput:
    """``logits`` ``[B, T, vocab]``; ``routing`` ``[num_moe_layers, B, T, k]`` expert indices when asked
    for (Keep Routing); ``indexing`` ``[num_hidden_layers, B, T, index_topk]`` the keys each query
    attended to, as row positions (``int32``, −1 empty; :mod:`dsv32.dsa.keep`) when asked for (Keep
    Indexing); ``cache`` the KV cache that was filled, if any."""

    logits: torch.Tensor
    routing: torch.Tensor | None = None
    cache: KVCache | None = None
    indexing: torch.Tensor | None = None


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = MLA(config, layer_idx)
        self.mlp = (
            MoE(config)
            if config.is_moe_layer(layer_idx)
            else MLP(config.hidden_size, config.intermediate_size)
        )
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, key_padding_mask, cache, forced_routing, forced_topk=None):
        """``(output, routing or None, the attention's selection or None)``."""
        a, topk = self.self_attn(
            self.input_layernorm(x), cos, sin, key_padding_mask=key_padding_mask, cache=cache,
            forced_topk=forced_topk, return_topk=True,
        )  # fmt: skip
        x = x + a
        h = self.post_attention_layernorm(x)
        if isinstance(self.mlp, MoE):
            y, routing = self.mlp(h, forced_routing)
            return x + y, routing, topk
        return x + self.mlp(h), None, topk


class Backbone(nn.Module):
    """Everything but the LM head (HF's ``model.`` prefix)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config)


class DeepseekV32(nn.Module):
    """DeepSeek-V3.2 for causal LM. ``model(input_ids).logits`` is ``[B, T, vocab]``.

    Build random (``DeepseekV32(config)``), from a checkpoint (:meth:`from_pretrained`), or on the meta
    device for counting (``with torch.device("meta"): DeepseekV32(config)``).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        if self.lm_head.weight.device.type != "meta":
            self.init_weights()

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        input_ids: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: KVCache | None = None,
        routing: torch.Tensor | None = None,
        return_routing: bool = False,
        indexing: torch.Tensor | None = None,
        return_indexing: bool = False,
        logits_to_keep: int = 0,
    ) -> ModelOutput:
        """Run the model on ``input_ids`` ``[B, T]``.

        Args:
            attention_mask: ``[B, S]`` with 1 for real tokens and 0 for (left) padding over *all* keys
                (cached + new, ``S = cache.length + T``); ``None`` = no padding.
            position_ids: ``[B, T]``; default: counted from the mask (or from ``cache.length``).
            cache: a :class:`KVCache` of batch ``B`` to read and extend (advanced by T on return).
            routing: ``[num_moe_layers, B, T, k]`` expert indices to force (Keep Routing); the gate
                weights are still computed by the live router.
            return_routing: also return the expert indices chosen in this forward.
            indexing: ``[num_hidden_layers, B, T, index_topk]`` selections to force (Keep Indexing), as
                row positions (:mod:`dsv32.dsa.keep`); a layer whose queries see at most
                ``index_topk`` keys runs dense as always. The indexer still scores (its loss).
            return_indexing: also return the keys every query attended to (sparse mode only).
            logits_to_keep: if > 0, compute logits only for the last that many positions.
        """
        B, T = input_ids.shape
        if cache is not None and cache.batch_size != B:
            raise ValueError(
                f"the KV cache holds {cache.batch_size} sequences but input_ids has batch {B}; "
                "use a cache made for this batch (new_cache(batch_size, max_len))"
            )
        start = cache.length if cache is not None else 0
        key_padding_mask = None
        if attention_mask is not None:
            if attention_mask.shape != (B, start + T):
                raise ValueError(
                    f"attention_mask must be [B, cache.length + T] = {(B, start + T)}, got {tuple(attention_mask.shape)}"
                )
            key_padding_mask = attention_mask.bool()
            if bool(key_padding_mask.all()):
                key_padding_mask = None
        if position_ids is None:
            if attention_mask is not None:
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)[:, start:]
            else:
                position_ids = torch.arange(start, start + T, device=input_ids.device).expand(B, T)
        if routing is not None and routing.shape[:3] != (self.config.num_moe_layers, B, T):
            raise ValueError(
                f"routing must be [num_moe_layers={self.config.num_moe_layers}, B={B}, T={T}, k], "
                f"got {tuple(routing.shape)}"
            )

        forced_cols, keep = self._check_indexing(indexing, return_indexing, key_padding_mask, B, T, start)
        cos, sin = self.model.rotary(position_ids)
        x = self.model.embed_tokens(input_ids)
        chosen, selected = [], []
        for i, layer in enumerate(self.model.layers):
            forced = None
            if routing is not None and isinstance(layer.mlp, MoE):
                forced = routing[len(chosen)]
            x, layer_routing, topk = layer(
                x, cos, sin, key_padding_mask, cache, forced, None if forced_cols is None else forced_cols[i]
            )
            if layer_routing is not None:
                chosen.append(layer_routing)
            if return_indexing:
                selected.append(keep(topk))
        if cache is not None:
            cache.advance(T)
        x = self.model.norm(x)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        logits = self.lm_head(x)
        return ModelOutput(
            logits=logits,
            routing=torch.stack(chosen) if return_routing and chosen else None,
            cache=cache,
            indexing=torch.stack(selected) if return_indexing else None,
        )

    def _check_indexing(self, indexing, return_indexing: bool, key_padding_mask, B: int, T: int, start: int):
        """Keep Indexing's inputs: the forced selections as key columns ``[layers, B, T, k]`` (or
        None) and the function that turns a layer's selection (None: it ran dense) into its record."""
        if indexing is None and not return_indexing:
            return None, None
        cfg = self.config
        if any(layer.self_attn.dsa_mode != "sparse" for layer in self.model.layers):
            raise IndexingError(
                "Keep Indexing needs DSA in sparse mode (model.set_dsa_mode('sparse')): a dense-mode "
                "layer selects nothing to record or force"
            )
        k = self.model.layers[0].self_attn.index_topk
        if any(layer.self_attn.index_topk != k for layer in self.model.layers):
            raise IndexingError("Keep Indexing needs one index_topk for every layer")
        S = start + T
        device = self.lm_head.weight.device
        positions = key_positions(key_padding_mask, B, S, device)
        forced = None
        if indexing is not None:
            want = (cfg.num_hidden_layers, B, T, k)
            if tuple(indexing.shape) != want:
                raise IndexingError(
                    f"indexing must be [num_hidden_layers, B, T, index_topk] = {want}, got {tuple(indexing.shape)}"
                )
            offsets = row_offsets(key_padding_mask, B, device)
            forced = to_columns(indexing.to(device), offsets, S)
        query_pos = positions[:, start:]
        query_real = None if key_padding_mask is None else key_padding_mask[:, start:]

        def record(topk: torch.Tensor | None) -> torch.Tensor:
            if topk is None:  # every query saw at most index_topk keys: all of them
                return dense_positions(query_pos, query_real, k)
            return pad_slots(to_positions(topk, positions), k)

        return forced, record

    # ------------------------------------------------------------------ utilities
    def set_dsa_mode(self, mode: str, sparse_impl: str | None = None) -> None:
        """``mode``: ``"sparse"`` (DSA, the released model) or ``"dense"`` (full causal attention).
        ``sparse_impl``: ``"gather"`` (O(L·k), default) or ``"masked"`` (the O(L²) reference)."""
        if mode not in DSA_MODES:
            raise ValueError(f"dsa mode must be one of {DSA_MODES}, got {mode!r}")
        if sparse_impl is not None and sparse_impl not in SPARSE_IMPLS:
            raise ValueError(f"sparse_impl must be one of {SPARSE_IMPLS}, got {sparse_impl!r}")
        for layer in self.model.layers:
            layer.self_attn.dsa_mode = mode
            if sparse_impl is not None:
                layer.self_attn.sparse_impl = sparse_impl

    def set_indexer_fp8(self, scale_format: str | None = "ue8m0") -> None:
        """Select tokens as the released model's FP8 indexer does (:mod:`dsv32.dsa.fp8`): queries and
        keys Hadamard-rotated and quantized to e4m3 per vector, with ``"ue8m0"`` (power-of-two: the
        FP8 inference config) or ``"float"`` scales; ``None`` scores in fp32 again. An inference
        setting: keys are quantized as they enter the cache, so set it before a cache is filled (and
        a bf16 cache rounds ``"float"``-scaled keys to bf16; ``"ue8m0"`` ones it holds exactly)."""
        if scale_format is not None and scale_format not in SCALE_FORMATS:
            raise ValueError(f"scale_format must be None or one of {SCALE_FORMATS}, got {scale_format!r}")
        for layer in self.model.layers:
            layer.self_attn.indexer_fp8 = scale_format

    def new_cache(self, batch_size: int, max_len: int) -> KVCache:
        p = self.lm_head.weight
        return KVCache(self.config, batch_size, max_len, device=p.device, dtype=p.dtype)

    @torch.no_grad()
    def init_weights(self, std: float = 0.02) -> None:
        """Random init (as transformers does): normal(0, std) matrices, unit norms, zero biases/bias."""
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                module.weight.normal_(0.0, std)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()
            elif isinstance(module, RMSNorm | nn.LayerNorm):
                module.weight.fill_(1.0)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()
            elif isinstance(module, MoE):
                module.gate.weight.normal_(0.0, std)
                for p in module.experts.parameters():
                    p.normal_(0.0, std)
                if module.gate.e_score_correction_bias is not None:
                    module.gate.e_score_correction_bias.zero_()

    @classmethod
    def from_pretrained(
        cls, path: str | Path, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu"
    ) -> DeepseekV32:
        """Load a checkpoint directory in HF format (``config.json`` + safetensors, sharded or not,
        FP8 block-quantized or not). See :mod:`dsv32.model.checkpoint`."""
        return load_pretrained(cls, path, dtype=dtype, device=device)

    def save_pretrained(self, path: str | Path, max_shard_size: int = 4 << 30) -> None:
        """Write ``config.json`` + safetensors under HF weight names (sharded above ``max_shard_size``)."""
        save_pretrained(self, path, max_shard_size=max_shard_size)
