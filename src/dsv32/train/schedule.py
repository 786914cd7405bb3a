"""The learning-rate schedule both trainers use: linear warm-up, then cosine decay to a floor."""

from __future__ import annotations

import math


def warmup_cosine(step: int, total: int, warmup_steps: int, min_lr_ratio: float) -> float:
    """The factor on the base learning rate at ``step`` (from 0) of ``total``: linear warm-up over
    ``warmup_steps``, then cosine decay to ``min_lr_ratio`` at the last step."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(1, total - warmup_steps - 1)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
