"""The KV cache the engine gives transformers models: a ``DynamicCache`` whose full-attention layers
append in place.

transformers' ``DynamicLayer`` concatenates each step's keys and values onto everything held, so a
decode step copies the whole cache: at 6K tokens on SmolLM2-135M that is ~280 MB per token, a fifth of
the step on a CPU. :class:`GrowingLayer` keeps K/V in buffers with headroom
(:class:`~dsv32.dsa.hf.GrowingTensor`) and hands the model views ``[B, H, S, D]`` of them, with the
same values the concatenation holds, so outputs are unchanged to the bit.

:class:`GrowingCache` is a ``DynamicCache`` (everything that reads or reshapes one, transformers
included, works on it unchanged): its ``DynamicLayer`` layers are :class:`GrowingLayer`; sliding-window
and other layer kinds stay transformers' own. A forward with gradients enabled concatenates, as
``DynamicLayer`` does: autograd may save the K/V a forward reads (for the queries' gradient even when
K/V need none), and an append in place would change them before the backward. Whatever replaces or
drops the K/V (transformers' row selection, reorder, offload and reset, the engine's batch merge and
trim) frees the buffers with the views; a tensor assigned from outside is copied into a fresh buffer
at the next append.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from dsv32.dsa.hf import GrowingTensor


class GrowingLayer(DynamicLayer):
    """A full-attention cache layer whose K/V grow in place (see the module docstring)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._keys, self._values = GrowingTensor(2), GrowingTensor(2)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if torch.is_grad_enabled():  # autograd may save the K/V it reads (for the queries' gradient too)
            return super().update(key_states, value_states, *args, **kwargs)
        self.keys = self._keys.extend(self.keys, key_states)
        self.values = self._values.extend(self.values, value_states)
        return self.keys, self.values

    def crop(self, tokens_to_remove: int) -> None:
        """Remove the last ``-tokens_to_remove`` tokens (transformers' convention), keeping the buffers."""
        if tokens_to_remove >= 0 or not self.is_initialized:
            super().crop(tokens_to_remove)  # raises for a positive count, as transformers does
            return
        keep = self.get_seq_length() + tokens_to_remove
        self.keys = self._keys.cut(self.keys, keep)
        self.values = self._values.cut(self.values, keep)


class GrowingCache(DynamicCache):
    """``DynamicCache(config=config)`` with :class:`GrowingLayer` for its full-attention layers."""

    def __init__(self, config) -> None:
        super().__init__(config=config)
        self.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in self.layers]


def full_attention(config) -> bool:
    """Every layer of the engine's cache for a model of ``config`` is a full-attention one: rows of
    its cache can be cut, merged and padded (continuous batching, prefix reuse); a sliding window's
    cannot."""
    return not any(getattr(layer, "is_sliding", False) for layer in GrowingCache(config).layers)
