"""Rotary position embedding, in the two layouts DeepSeek-V3.2 uses.

``cos``/``sin`` hold one angle per rotated *pair*: shape ``[..., T, rope_dim // 2]`` (broadcast over
batch and heads by the caller). The two layouts differ only in which dims form a pair:

- **interleaved** (MLA's own RoPE, as in the DeepSeek reference): pairs ``(x[2i], x[2i+1])``;
- **half-split** (the lightning indexer, and Llama/Qwen models): pairs ``(x[i], x[i + d/2])``.

Mixing them up silently degrades the indexer (DeepSeek fixed exactly this bug in their demo code), so
the layout is always an explicit argument.
"""

from __future__ import annotations

import torch


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool) -> torch.Tensor:
    """Rotate the last dim of ``x`` ``[..., T, (H,) rope_dim]`` by angles ``cos``/``sin``.

    ``cos``/``sin`` must broadcast against ``x[..., : rope_dim // 2]``; callers insert the head axis.
    Computed in fp32 and cast back to ``x.dtype``.
    """
    dtype = x.dtype
    x = x.float()
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    else:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.to(dtype)
