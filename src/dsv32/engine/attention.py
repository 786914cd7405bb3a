"""The attention function the engine runs transformers models with during generation.

transformers' ``sdpa`` attention hands a grouped-query layer's one-token decode step to PyTorch's SDPA
with ``enable_gqa=True`` whenever the step has no attention mask (every row of the batch is as long as
the others). On a CPU that kernel is several times slower than the same attention with the query
heads of each key/value head packed along the query axis (``[B, H_kv, G, D]`` against ``[B, H_kv, S,
D]``): on SmolLM2-135M it was two thirds of a bfloat16 decode step at 32 rows. transformers itself
packs a masked decode step that way (``pack_gqa``); :func:`engine_attention` packs every one-token
step, masked or not, and hands everything else (prefill, chunks of several tokens, a forward that
records gradients) to transformers' own ``sdpa`` function unchanged.

Where the CPU kernels are built (:mod:`dsv32.dsa.kernels.cpu`), a bf16 one-token step on CPU runs
the dense decode kernel instead: every (row, KV head) reads its keys and values once, straight from
the cache's views, in fp32 arithmetic, on torch's OpenMP threads. On SmolLM2 at 32 rows × 250 cached
tokens it takes ~0.4 ms a layer inside a decode step, where SDPA's packed call took ~1 ms. Its
results agree with SDPA's to float rounding, not bit for bit, so fp32 steps keep SDPA's call: an
fp32 RL run then samples exactly what it sampled before (the kernel's rounding-level differences
were enough to send the agentic proof's seeded GRPO rollouts down another path, see
docs/results.md), at the cost of ~10 % of an fp32 step at 32 rows.

:func:`decode_attention` scopes it to the engine's calls: within it a model whose attention is
``sdpa`` runs with :func:`engine_attention` (registered as ``"dsv32"`` in transformers' attention and
mask interfaces; the mask is SDPA's own). A trainer that shares the model is not affected outside the
engine's calls, and inside them a forward with gradients gets ``sdpa`` itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from dsv32.dsa.kernels import cpu as kernels

NAME = "dsv32"


def engine_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query`` ``[B, H, T, D]``, ``key``/``value``
    ``[B, H_kv, S, D]``, ``attention_mask`` SDPA's (bool ``[B, 1, T, S]``, True = attend, or None).
    Returns ``([B, T, H, D], None)``."""
    B, H, T, D = query.shape
    H_kv = key.shape[1]
    plain = (
        T == 1
        and not torch.is_grad_enabled()
        and dropout == 0.0
        and kwargs.get("softcap") is None
        and kwargs.get("position_bias") is None
        and kwargs.get("sinks") is None
        and (attention_mask is None or attention_mask.dtype == torch.bool)
    )
    if not plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    if (
        query.dtype == torch.bfloat16  # fp32 keeps SDPA's arithmetic: see the module docstring
        and kernels.decode_gqa_supported(query, key, value)
        and (attention_mask is None or attention_mask.shape[1:3] == (1, 1))
    ):
        rows = None if attention_mask is None else attention_mask[:, 0, 0, :].expand(B, key.shape[2])
        scale = scaling if scaling is not None else D**-0.5  # SDPA's default
        return kernels.decode_gqa_attention_cpu(query, key, value, rows, scale), None
    G = H // H_kv
    out = F.scaled_dot_product_attention(
        query.reshape(B, H_kv, G, D),  # query head h reads key/value head h // G
        key,
        value,
        attn_mask=attention_mask,  # [B, 1, 1, S]: one row, shared by every head
        scale=scaling,
    )
    return out.reshape(B, 1, H, value.shape[-1]), None


ALL_ATTENTION_FUNCTIONS.register(NAME, engine_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)


@contextlib.contextmanager
def decode_attention(model) -> Iterator[None]:
    """Run ``model`` (a transformers model) with :func:`engine_attention` where it uses ``sdpa``."""
    config = model.config
    if getattr(config, "_attn_implementation", None) != "sdpa":
        yield
        return
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"
