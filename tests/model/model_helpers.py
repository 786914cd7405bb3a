"""Helpers shared by the model tests (importable: conftest puts this folder on sys.path)."""

from __future__ import annotations

import torch

import dsv32.model.attention as mla_module


def token_ids(T: int, B: int = 2, seed: int = 0, vocab: int = 128) -> torch.Tensor:
    """Random token ids ``[B, T]`` below ``vocab`` (the tiny reference model's vocabulary)."""
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


def record_indexer_topk(monkeypatch) -> list[tuple[tuple, dict, torch.Tensor]]:
    """Every ``indexer_topk`` call the model makes, as ``(args, kwargs, selection)``."""
    calls = []
    real = mla_module.indexer_topk

    def recording(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append((args, kwargs, out))
        return out

    monkeypatch.setattr(mla_module, "indexer_topk", recording)
    return calls
