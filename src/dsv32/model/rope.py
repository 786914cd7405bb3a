"""RoPE frequencies with YaRN scaling, shared by MLA (interleaved) and the indexer (half-split).

The frequency formula is DeepSeek's ``precompute_freqs_cis`` (and transformers' ``yarn``): dims whose
wavelength is short relative to the original context keep their frequency, long ones are divided by
``factor``, with a linear ramp between ``beta_fast`` and ``beta_slow`` rotations. YaRN's temperature
correction enters the *softmax scale* (``ModelConfig.softmax_scale``), and the cos/sin tables carry
``mscale/mscale_all_dim`` (1 for every released config).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from dsv32.model.config import ModelConfig, yarn_mscale


def rope_inv_freq(dim: int, theta: float, rope_scaling: dict | None) -> tuple[torch.Tensor, float]:
    """Inverse frequencies ``[dim/2]`` (fp32) and the cos/sin amplitude factor."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    if not rope_scaling:
        return inv_freq, 1.0
    factor = float(rope_scaling["factor"])
    original = int(rope_scaling["original_max_position_embeddings"])
    beta_fast = float(rope_scaling.get("beta_fast") or 32)
    beta_slow = float(rope_scaling.get("beta_slow") or 1)

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rope_scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    inv_freq = inv_freq / factor * ramp + inv_freq * (1 - ramp)
    mscale, mscale_all = rope_scaling.get("mscale"), rope_scaling.get("mscale_all_dim")
    if rope_scaling.get("attention_factor") is not None:
        amplitude = float(rope_scaling["attention_factor"])
    elif mscale and mscale_all:
        amplitude = yarn_mscale(factor, float(mscale)) / yarn_mscale(factor, float(mscale_all))
    else:
        amplitude = yarn_mscale(factor)
    return inv_freq, amplitude


class RotaryEmbedding(nn.Module):
    """Maps ``position_ids`` ``[B, T]`` to ``(cos, sin)`` ``[B, T, qk_rope_head_dim/2]`` (fp32).

    The frequencies are a plain attribute, not a buffer: they are derived from the config, so a model
    built on the meta device and then loaded from a checkpoint needs no re-initialization.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        with torch.device("cpu"):
            self.inv_freq, self.amplitude = rope_inv_freq(
                config.qk_rope_head_dim, config.rope_theta, config.rope_scaling
            )

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.inv_freq.device != position_ids.device:
            self.inv_freq = self.inv_freq.to(position_ids.device)
        angles = position_ids.float().unsqueeze(-1) * self.inv_freq
        return angles.cos() * self.amplitude, angles.sin() * self.amplitude
