"""``tokenizer``: the byte-level SFT tokenizer with the V3.2 special tokens, one per module."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tokenizer():
    from dsv32.chat import add_v32_special_tokens
    from dsv32.train.sft.model import byte_level_tokenizer

    tok = byte_level_tokenizer()
    add_v32_special_tokens(tok)
    return tok
