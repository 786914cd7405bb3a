"""What the training tests share: the tiny DSA config and random token data."""

from __future__ import annotations

import torch

from dsv32.dsa import DSAConfig
from dsv32.train import TokenData

#: DSA on a tiny model: 2 indexer heads of 16 dims, top-8.
TINY_DSA = DSAConfig(index_n_heads=2, index_head_dim=16, index_topk=8)


def token_data(n: int = 12, T: int = 32, seed: int = 0) -> TokenData:
    """``n`` random byte-vocabulary (257 ids) training sequences of ``T`` tokens and 4 held-out ones."""
    g = torch.Generator().manual_seed(seed)
    return TokenData.from_sequences(
        torch.randint(0, 257, (n, T), generator=g), torch.randint(0, 257, (4, T), generator=g)
    )
