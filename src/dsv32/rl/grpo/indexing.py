"""DSA in post-training (paper §3: "post-training … employs sparse attention in the same way as the
sparse continued pre-training stage"): which policies select with DSA, the indexer's parameters, and
its KL loss (Eq. 4 over the selected set) collected from the policy's training forward.

The indexer reads detached inputs and its loss's target is computed without gradients, so one
backward of ``policy loss + L_I`` gives the policy only the policy loss's gradient and the indexer
only L_I's (the sparse stage of :mod:`dsv32.train.dsa.trainer` rests on the same property).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from dsv32.dsa.hf import get_dsa, has_dsa, sparse_dsa

__all__ = ["indexer_losses", "is_indexer_parameter", "sparse_dsa"]


def _native_layers(model: nn.Module) -> list[nn.Module] | None:
    """The attention modules of a native V3.2 model (None for another kind of model)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or not all(hasattr(layer.self_attn, "dsa_mode") for layer in layers):
        return None
    return [layer.self_attn for layer in layers]


def is_indexer_parameter(name: str) -> bool:
    return ".indexer." in name or name.startswith("indexer.")


@contextmanager
def indexer_losses(model: nn.Module, on: bool) -> Iterator[dict[int, torch.Tensor]]:
    """Within the block, ``model``'s cache-free forwards compute each DSA layer's indexer KL loss
    (Eq. 4 over the selection they attend to); the dict yielded holds them by layer after the block
    (empty when ``on`` is False)."""
    out: dict[int, torch.Tensor] = {}
    if not on:
        yield out
        return
    if has_dsa(model):
        handle = get_dsa(model)
        old = handle.collect_loss
        handle.collect_loss, handle.losses = True, {}
        try:
            yield out
            out.update(handle.pop_losses())
        finally:
            handle.collect_loss = old
        return
    layers = _native_layers(model) or []
    for m in layers:
        m.compute_indexer_loss, m.indexer_loss = True, None
    try:
        yield out
        out.update({i: m.indexer_loss for i, m in enumerate(layers) if m.indexer_loss is not None})
    finally:
        for m in layers:
            m.compute_indexer_loss, m.indexer_loss = False, None
