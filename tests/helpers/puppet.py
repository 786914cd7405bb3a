"""Forcing what a model samples next: its LM head's logits replaced, one forward at a time."""

from __future__ import annotations

import torch


class ForcedTokens:
    """Forces the next sampled tokens (one per forward) to be the queued ones (``queue``); the model
    samples freely once the queue is empty. ``remove()`` takes the hook off the model."""

    def __init__(self, model) -> None:
        self.queue: list[int] = []
        self.handle = model.lm_head.register_forward_hook(self.hook)

    def hook(self, module, inputs, output):
        if not self.queue:
            return output
        forced = torch.full_like(output, -1e4)
        forced[:, -1, self.queue.pop(0)] = 1e4
        return forced

    def remove(self) -> None:
        self.handle.remove()
