"""Best-fit decreasing packing: the same bins as the definition (each example, longest first, into
the fullest bin it fits)."""

from __future__ import annotations

import random

from dsv32.train.sft.data import pack


def best_fit_decreasing(lengths: list[int], seq_len: int) -> list[list[int]]:
    """The definition, one scan over the bins per example."""
    bins: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        fits = [j for j in range(len(bins)) if free[j] >= lengths[i]]
        if fits:
            j = min(fits, key=lambda j: free[j])
            bins[j].append(i)
            free[j] -= lengths[i]
        else:
            bins.append([i])
            free.append(seq_len - lengths[i])
    return bins


def test_pack_gives_the_bins_of_the_definition():
    rng = random.Random(0)
    for _ in range(200):
        seq_len = rng.choice([8, 50, 1000])
        n = rng.randint(0, 200)
        if rng.random() < 0.5:
            lengths = [rng.randint(1, seq_len) for _ in range(n)]
        else:  # many ties in length and in free space
            lengths = [rng.choice([1, 2, seq_len // 2, seq_len]) for _ in range(n)]
        assert pack(lengths, seq_len) == best_fit_decreasing(lengths, seq_len)


def test_pack_places_every_conversation_of_a_large_set_within_its_bins():
    rng = random.Random(1)
    lengths = [rng.randint(200, 1500) for _ in range(100_000)]
    bins = pack(lengths, 4096)
    assert sorted(i for b in bins for i in b) == list(range(100_000))
    assert all(sum(lengths[i] for i in b) <= 4096 for b in bins)
