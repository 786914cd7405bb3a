"""The bytes of one token as OpenAI's ``logprobs`` report them: the token's own UTF-8 bytes, so that the
pieces of a character split over several tokens join into it.

Decoding a lone token does not give them: a token holding part of a character decodes to U+FFFD. They
come from the token's piece in the vocabulary instead: byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM2,
DeepSeek) writes each byte as one printable character, SentencePiece's byte fallback writes a byte as
``<0xNN>`` and a space as ``▁``; added and special tokens are their own text. Where none of these
applies and the decoded token is not whole text, the bytes are unknown: None, as OpenAI allows.
"""

from __future__ import annotations

import re

from dsv32.engine.models import ByteTokenizer

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's ``bytes_to_unicode`` inverted: the printable character that stands for each byte → the byte."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    alphabet, shifted = {}, 0
    for byte in range(256):
        if byte in printable:
            alphabet[chr(byte)] = byte
        else:
            alphabet[chr(256 + shifted)] = byte
            shifted += 1
    return alphabet


_BYTE_LEVEL = _byte_level_alphabet()


def _decoder_state(tokenizer) -> str:
    """The JSON of a fast tokenizer's decoder ("" for any other tokenizer)."""
    try:
        return tokenizer.backend_tokenizer.decoder.__getstate__().decode("utf-8")
    except (AttributeError, UnicodeDecodeError):
        return ""


class TokenBytes:
    """``token_bytes(id)``: the UTF-8 bytes token ``id`` stands for, or None where they are unknown."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        decoder = _decoder_state(tokenizer)
        self.byte_level = '"ByteLevel"' in decoder
        self.metaspace = "▁" in decoder  # SentencePiece: ▁ is a space (Metaspace, or Replace ▁ → " ")
        added = tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}
        self.added = {int(i): text for text, i in added.items()}

    def __call__(self, token: int) -> list[int] | None:
        if isinstance(self.tokenizer, ByteTokenizer):
            return [token] if 0 <= token < 256 else []
        if token in self.added:
            return list(self.added[token].encode("utf-8"))
        piece = self.tokenizer.convert_ids_to_tokens(token)
        if isinstance(piece, str) and piece:
            if self.byte_level:
                if all(ch in _BYTE_LEVEL for ch in piece):
                    return [_BYTE_LEVEL[ch] for ch in piece]
            elif match := _BYTE_PIECE.fullmatch(piece):
                return [int(match[1], 16)]
            elif self.metaspace:
                return list(piece.replace("▁", " ").encode("utf-8"))
        text = self.tokenizer.decode([token], skip_special_tokens=False)
        return None if "\ufffd" in text else list(text.encode("utf-8"))
