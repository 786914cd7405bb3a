"""The ``bytes`` of a log-prob entry are the token's own UTF-8 bytes: the entries of the tokens that
split one character join into it, on byte-level BPE, SentencePiece byte fallback and the byte tokenizer."""

from __future__ import annotations

import pytest
from helpers import v32_model

from dsv32.engine.models import ByteTokenizer
from dsv32.engine.tokenbytes import TokenBytes

WAVE = "🌊"  # four UTF-8 bytes, none a character alone


def _sentencepiece_byte_fallback():
    """A Llama-2-style tokenizer: ``▁`` for spaces, ``<0xNN>`` for bytes of unknown characters."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}}
    for piece in ("▁", "h", "i", "▁h", "▁hi"):
        vocab[piece] = len(vocab)
    core = Tokenizer(
        models.BPE(vocab=vocab, merges=[("▁", "h"), ("▁h", "i")], unk_token="<unk>", byte_fallback=True)
    )
    core.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    core.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>")


def _byte_level_with_merges():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab["ðŁ"] = len(vocab)  # the wave's first two bytes, one token (SmolLM2 has this one too)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[("ð", "Ł")]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=core)


@pytest.mark.parametrize(
    "make", [v32_model.byte_tokenizer, _byte_level_with_merges, _sentencepiece_byte_fallback, ByteTokenizer]
)
def test_the_bytes_of_a_characters_tokens_join_into_its_utf8(make):
    tokenizer = make()
    token_bytes = TokenBytes(tokenizer)
    ids = list(tokenizer.encode(f"hi {WAVE}", add_special_tokens=False))
    pieces = [token_bytes(i) for i in ids]
    assert len(ids) >= 3 and all(p is not None for p in pieces)
    joined = bytes(b for piece in pieces for b in piece)
    assert joined.endswith(WAVE.encode("utf-8")) and joined.strip() == f"hi {WAVE}".encode()


def test_special_tokens_are_their_text():
    tokenizer = v32_model.byte_tokenizer()
    assert TokenBytes(tokenizer)(tokenizer.eos_token_id) == list(tokenizer.eos_token.encode("utf-8"))


def test_the_schedulers_log_prob_entries_carry_the_token_bytes(v32_served):
    from dsv32.serve.scheduler import Scheduler

    scheduler = Scheduler(v32_served)
    ids = v32_served.encode(WAVE)
    entries = [scheduler._token_logprob(i, -1.0) for i in ids]
    assert len(ids) == 4 and bytes(b for e in entries for b in e["bytes"]) == WAVE.encode("utf-8")
    # a part of a character is its escaped bytes, as OpenAI writes it; whole text is itself
    assert [e["token"] for e in entries] == ["\\xf0", "\\x9f", "\\x8c", "\\x8a"]
    assert scheduler._token_logprob(v32_served.encode("a")[0], -1.0)["token"] == "a"
