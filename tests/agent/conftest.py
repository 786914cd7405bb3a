"""``stub`` is a stub Chat Completions server, closed after the test; ``smollm2_tokenizer`` is SmolLM2's
tokenizer and ``v32_tokenizer`` the same with the V3.2 special tokens."""

from __future__ import annotations

import copy

import pytest
from helpers.agent import Stub


@pytest.fixture
def stub():
    s = Stub()
    yield s
    s.close()


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    """SmolLM2's tokenizer (from the converted copy when it exists: no model load)."""
    from transformers import AutoTokenizer

    from dsv32.engine.models import SMOLLM2_GGUF, load_model, smollm2_dir
    from dsv32.paths import cache_dir

    converted = cache_dir(f"smollm2-135m-instruct-{(smollm2_dir() / SMOLLM2_GGUF).stat().st_size}")
    if (converted / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(converted)
    return copy.deepcopy(load_model("smollm2", device="cpu").tokenizer)


@pytest.fixture(scope="module")
def v32_tokenizer(smollm2_tokenizer):
    """SmolLM2's tokenizer + the V3.2 tokens."""
    from dsv32.chat import add_v32_special_tokens

    tokenizer = copy.deepcopy(smollm2_tokenizer)
    add_v32_special_tokens(tokenizer)
    return tokenizer
