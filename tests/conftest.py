"""Shared test setup: offline Hugging Face, deterministic CPU threads."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="module")
def one_thread():
    """One torch intra-op thread for a module of small-model tests: on a shared 2-core machine two
    contended threads decode several times slower than one."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
