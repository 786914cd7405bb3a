"""The engine's one-token decode step for Llama-family transformers models (Llama, Qwen2, Mistral
without a sliding window): the same arithmetic as transformers' forward, with the products a decode
step is made of run where this CPU runs them fastest.

A decode step multiplies a few rows (the batch) by every weight matrix of the model. torch's
``linear`` hands that to oneDNN with the weights as they are stored, and at one to eight rows oneDNN
then reads them at a third of the memory bandwidth; with the weights reordered once into oneDNN's
blocked layout for matrix products (``torch.ops.mkldnn._reorder_linear_weight``, what PyTorch's own
compiler and vLLM's CPU backend use) the same products take 1.4-2× less time on SmolLM2-135M
(:class:`PackedWeights`). The packed copies are made when a model first decodes here and remade when
a weight changes (a trainer's update, a weight sync: torch counts every in-place change of a tensor);
they cost one more copy of the linear weights, so models whose linear weights exceed
:data:`PACK_LIMIT_BYTES` are not packed (``DSV32_PACKED_WEIGHTS=0`` turns packing off).

:func:`decode_step` is the model's own forward written out for one token per row: RMSNorm, the
projections, rotary embeddings (the model's own rotary module and ``apply_rotary_pos_emb``, so every
RoPE scaling applies), the KV cache's ``update``, attention with the query heads packed per key/value
head (:func:`dsv32.engine.attention.engine_attention`), the gated MLP with the model's own activation
and norms, and the LM head; on SmolLM2 its logits equal transformers' to the bit with unpacked
weights. :func:`supported` says which models it
takes: anything else (a DSA-attached model, LoRA layers, hooks such as FSDP's, a model in training
mode, other architectures) runs transformers' forward.
"""

from __future__ import annotations

import os
import sys
import weakref

import torch
from torch import nn

from dsv32.dsa.hf import has_dsa
from dsv32.engine.attention import engine_attention

ARCHITECTURES = ("llama", "qwen2", "mistral")
PACK_LIMIT_BYTES = 4 << 30
_PACK_DTYPES = (torch.float32, torch.bfloat16)
#: bf16 products of fewer rows are padded to this many: oneDNN's packed bf16 kernel for one row is
#: ~100× slower than for several, and four padded rows take less time than one unpacked row
BF16_MIN_ROWS = 4


def _plain(module: nn.Module) -> bool:
    return not (module._forward_hooks or module._forward_pre_hooks)


def _modeling(model):
    """The transformers module that defines ``model``'s class (its ``apply_rotary_pos_emb``)."""
    return sys.modules[type(model).__module__]


def _one_or_all(outs: tuple[torch.Tensor, ...]) -> torch.Tensor | tuple[torch.Tensor, ...]:
    return outs[0] if len(outs) == 1 else outs


def _unpacked(x: torch.Tensor, *layers: nn.Linear) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """The layers themselves (no packed copies)."""
    return _one_or_all(tuple(m(x) for m in layers))


def supported(model) -> bool:
    """Whether :func:`decode_step` computes ``model``'s forward: a Llama-family causal LM in eval
    mode, full attention in every layer, plain ``nn.Linear`` projections, no hooks (FSDP, peft and
    other wrappers add them or replace the layers), no DSA attached."""
    from dsv32.engine.hfcache import full_attention

    config = model.config
    inner = getattr(model, "model", None)
    if (
        getattr(config, "model_type", None) not in ARCHITECTURES
        or model.training
        or has_dsa(model)
        or inner is None
        or getattr(config, "pretraining_tp", 1) != 1
        or not full_attention(config)
        or not hasattr(inner, "rotary_emb")
        or not hasattr(_modeling(model), "apply_rotary_pos_emb")
        or type(getattr(model, "lm_head", None)) is not nn.Linear
        or nn.modules.module._global_forward_hooks
        or nn.modules.module._global_forward_pre_hooks
    ):
        return False
    for layer in inner.layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears = (
            attn.q_proj,
            attn.k_proj,
            attn.v_proj,
            attn.o_proj,
            mlp.gate_proj,
            mlp.up_proj,
            mlp.down_proj,
        )
        if any(type(m) is not nn.Linear for m in linears):
            return False
        if getattr(attn, "sliding_window", None) is not None or getattr(attn, "q_norm", None) is not None:
            return False
    return all(_plain(m) for m in model.modules())


class PackedWeights:
    """oneDNN-packed copies of a model's linear weights, remade when a weight changes. Layers that
    read the same input (a layer's query, key and value projections; its gate and up projections)
    are packed as one matrix, so one product computes them all."""

    def __init__(self) -> None:
        # the layers' weights (by id) → (the weights themselves, weakly; the addresses and versions of
        # the weights and biases; the packed matrix; its bias). The weak references tell a weight
        # from a later one that happens to get a freed weight's id.
        self.copies: dict[tuple[int, ...], tuple[tuple, tuple, torch.Tensor, torch.Tensor | None]] = {}
        self.failed = False

    def _packed(self, layers: tuple[nn.Linear, ...]) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        weights = [m.weight for m in layers]
        key = tuple(id(w) for w in weights)
        tensors = [t for m in layers for t in (m.weight, m.bias) if t is not None]
        stamp = tuple((t.data_ptr(), t._version) for t in tensors)  # a trainer's step changes both
        held = self.copies.get(key)
        if held is None or held[1] != stamp or any(r() is not w for r, w in zip(held[0], weights)):
            weight = weights[0] if len(layers) == 1 else torch.cat(weights)
            biases = [m.bias for m in layers]
            bias = None
            if any(b is not None for b in biases):
                bias = torch.cat(
                    [b if b is not None else w.new_zeros(w.shape[0]) for b, w in zip(biases, weights)]
                )
            try:
                packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
            except (RuntimeError, AttributeError):  # a torch build without oneDNN
                self.failed = True
                return None
            refs = tuple(weakref.ref(w) for w in weights)
            held = (refs, stamp, packed, None if bias is None else bias.detach())
            self.copies[key] = held
        return held[2], held[3]

    def linear(self, x: torch.Tensor, *layers: nn.Linear) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """``layer(x)`` for each of ``layers`` (``x`` ``[rows, in]``): one tensor for one layer, a
        tuple for several."""
        packed = None if self.failed else self._packed(layers)
        if packed is None:
            return _unpacked(x, *layers)
        weight, bias = packed
        rows = x.shape[0]
        if x.dtype == torch.bfloat16 and rows < BF16_MIN_ROWS:  # oneDNN's bf16 kernels for 1-2 rows are slow
            x = torch.cat((x, x.new_zeros(BF16_MIN_ROWS - rows, x.shape[1])))
        y = torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")[:rows]
        return _one_or_all(y.split([m.out_features for m in layers], dim=-1))


_packed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def packed_weights(model) -> PackedWeights | None:
    """The model's :class:`PackedWeights`, or None where packing does not apply (not a CPU model, a
    dtype oneDNN does not pack, linear weights over :data:`PACK_LIMIT_BYTES`, turned off)."""
    if os.environ.get("DSV32_PACKED_WEIGHTS", "1") == "0":
        return None
    if model in _packed:
        return _packed[model]
    weight = model.lm_head.weight
    linear_bytes = sum(
        m.weight.numel() * m.weight.element_size() for m in model.modules() if isinstance(m, nn.Linear)
    )
    ok = (
        weight.device.type == "cpu"
        and weight.dtype in _PACK_DTYPES
        and linear_bytes <= PACK_LIMIT_BYTES
        and torch.backends.mkldnn.is_available()
    )
    _packed[model] = PackedWeights() if ok else None
    return _packed[model]


@torch.no_grad()
def decode_step(model, cache, tokens: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """One token per row: ``tokens`` ``[B]`` appended to ``cache`` (a ``DynamicCache``),
    ``attention_mask`` ``[B, S]`` over every token so far, this one included (1 = real). Returns the
    next-token logits ``[B, V]`` (what ``model(...).logits[:, -1]`` gives)."""
    inner = model.model
    rotate = _modeling(model).apply_rotary_pos_emb
    packed = packed_weights(model)
    linear = packed.linear if packed is not None else _unpacked
    B = tokens.shape[0]
    positions = attention_mask.sum(-1, keepdim=True) - 1  # padding does not shift a row's positions
    h = inner.embed_tokens(tokens)  # [B, hidden]
    cos, sin = inner.rotary_emb(h[:, None], positions)  # [B, 1, head_dim]
    mask = None if bool(attention_mask.all()) else attention_mask.bool()[:, None, None, :]
    for i, layer in enumerate(inner.layers):
        attn, mlp = layer.self_attn, layer.mlp
        x = layer.input_layernorm(h)
        q, k, v = (
            t.reshape(B, -1, 1, attn.head_dim) for t in linear(x, attn.q_proj, attn.k_proj, attn.v_proj)
        )
        q, k = rotate(q, k, cos, sin)
        keys, values = cache.update(k, v, i)
        out, _ = engine_attention(attn, q, keys, values, mask, scaling=attn.scaling)
        h = h + linear(out.reshape(B, -1), attn.o_proj)
        x = layer.post_attention_layernorm(h)
        gate, up = linear(x, mlp.gate_proj, mlp.up_proj)
        h = h + linear(mlp.act_fn(gate) * up, mlp.down_proj)
    return linear(inner.norm(h), model.lm_head)
