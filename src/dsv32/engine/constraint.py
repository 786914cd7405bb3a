"""Constrained decoding: a grammar says which tokens may come next, and the sampler draws only from them.

A :class:`Grammar` — a Lark grammar in llguidance's dialect, JSON schemas embedded with ``%json``
(:func:`json_rule`) — is compiled once per request against a :class:`Vocabulary`, the bytes of every
token of one tokenizer (built once per model, about a second for a 50k vocabulary). Each generated
sequence gets its own :class:`Constraint`, the grammar's matcher at that sequence's position: each step
:meth:`Constraint.allowed` is the ``[V]`` boolean mask of the tokens that keep the text a prefix of a
sentence of the grammar (the end tokens only where the text is complete), the sampler applies it to
the logits before temperature, top-k and top-p (``allowed`` of
:func:`~dsv32.engine.sampling.sample_next`), and :meth:`Constraint.advance` moves the matcher over
the token drawn. One mask costs tens of microseconds (docs/results.md).

Tokens are text to the grammar: each stands for the bytes it decodes to with special tokens kept, so a
grammar constrains exactly the text a parser reads back. Special tokens (the end tokens, the chat
template's markers, ids the tokenizer cannot decode) never match text, except those whose text is part
of a format's markup (``markup``: the DSML tag, ``</think>``, ``[TOOL_CALLS]``, ...), which the
format's grammar writes as text. Grammars only constrain: a grammar the library cannot compile (an
unsupported JSON-schema keyword, an unresolvable ``$ref``) is a :class:`GrammarError`.
"""

from __future__ import annotations

import json
import re
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from dsv32.engine.tokenbytes import TokenBytes
from dsv32.errors import DSV32Error

#: How JSON is written inside a grammar: json.dumps' separators and no other whitespace, so a model
#: cannot spend its tokens on spaces and newlines (llguidance's default lets it).
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

_SHIFTS = torch.arange(32, dtype=torch.int32)


class GrammarError(DSV32Error, ValueError):
    """A grammar (or a JSON schema in it) that cannot be compiled, or a token the grammar does not allow."""


def lark_string(text: str) -> str:
    """``text`` as a Lark string literal."""
    return json.dumps(text, ensure_ascii=False)


def json_rule(schema: dict[str, Any]) -> str:
    """The Lark body ``%json {...}`` of JSON text valid under ``schema``, written as :data:`JSON_STYLE`."""
    if not isinstance(schema, dict):
        raise GrammarError(f"a JSON schema must be an object, got {type(schema).__name__}")
    return "%json " + json.dumps({**schema, "x-guidance": JSON_STYLE}, ensure_ascii=False)


class _TokenTable:
    """What llguidance's ``TokenizerWrapper`` reads: the bytes of every id, the special ids, an encoder."""

    def __init__(self, tokenizer, tokens: list[bytes], special: list[int], eos: int) -> None:
        self.tokenizer = tokenizer
        self.tokens = tokens
        self.special_token_ids = special
        self.eos_token_id = eos
        self.bos_token_id = None

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return list(self.tokenizer.encode(text, add_special_tokens=False))


def _special_ids(tokenizer) -> set[int]:
    ids = {int(i) for i in getattr(tokenizer, "all_special_ids", None) or []}
    for i, token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(token, "special", False):
            ids.add(int(i))
    return ids


def _is_markup(text: str, markup: Sequence[str]) -> bool:
    """A special token's ``text`` is part of a format's markup (or holds a piece of it)."""
    return any(text in m or m in text for m in markup)


class Vocabulary:
    """The tokens of ``tokenizer`` as llguidance sees them, for a model with ``vocab_size`` logits.

    ``eos_ids`` end a sequence (allowed only where the grammar is complete); ``markup`` are the strings
    of a format's markup: a special token whose text is part of one (or holds one) is text to the
    grammar. Build it with :func:`vocabulary`, which keeps one per tokenizer.
    """

    def __init__(
        self, tokenizer, vocab_size: int, eos_ids: Sequence[int], markup: Sequence[str] = ()
    ) -> None:
        import llguidance

        eos = sorted({int(i) for i in eos_ids if 0 <= int(i) < vocab_size})
        if not eos:
            raise GrammarError("constrained decoding needs the model's end token ids")
        token_bytes = TokenBytes(tokenizer)
        special = _special_ids(tokenizer)
        size = min(len(tokenizer), vocab_size)
        tokens: list[bytes] = []
        special_ids: list[int] = []
        for i in range(vocab_size):
            raw = bytes(token_bytes(i) or b"") if i < size else b""
            if (
                raw
                and i not in eos
                and (i not in special or _is_markup(raw.decode("utf-8", "replace"), markup))
            ):
                tokens.append(raw)
            else:
                tokens.append(f"<[{i}]>".encode())  # never text: only a grammar naming the id matches it
                special_ids.append(i)
        table = _TokenTable(tokenizer, tokens, special_ids, eos[0])
        self.tokenizer = llguidance.LLTokenizer(
            llguidance.TokenizerWrapper(table), n_vocab=vocab_size, eos_token=eos
        )
        self.vocab_size = vocab_size
        self.eos_ids = eos


_VOCABULARIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def vocabulary(tokenizer, vocab_size: int, eos_ids: Sequence[int], markup: Sequence[str] = ()) -> Vocabulary:
    """The :class:`Vocabulary` of ``tokenizer`` with these settings, built once and kept while it lives."""
    key = (vocab_size, tuple(sorted(eos_ids)), tuple(markup))
    with _LOCK:
        kept = _VOCABULARIES.setdefault(tokenizer, {})
        if key not in kept:
            kept[key] = Vocabulary(tokenizer, vocab_size, eos_ids, markup)
        return kept[key]


def _message(error: str) -> str:
    """llguidance's error without its position in the generated grammar text (meaningless to a user)."""
    first = error.strip().splitlines()[0] if error.strip() else "invalid grammar"
    return re.sub(r"^at \d+\(\d+\): ", "", first)


class Grammar:
    """A Lark grammar compiled for ``vocabulary``; :meth:`constraint` starts a sequence under it."""

    def __init__(self, lark: str, vocabulary: Vocabulary) -> None:
        import llguidance

        self.lark = lark
        self.vocabulary = vocabulary
        self.text = llguidance.LLMatcher.grammar_from_lark(lark)
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            self.text, vocabulary.tokenizer
        )
        if failed:
            raise GrammarError(_message(messages[0]))

    def constraint(self) -> Constraint:
        return Constraint(self)


class Constraint:
    """One sequence's position in a :class:`Grammar` (not thread-safe; one per generated row)."""

    def __init__(self, grammar: Grammar) -> None:
        import llguidance

        self.grammar = grammar
        self.matcher = llguidance.LLMatcher(grammar.vocabulary.tokenizer, grammar.text, log_level=0)
        if self.matcher.is_error():
            raise GrammarError(_message(self.matcher.get_error()))
        self.vocab_size = grammar.vocabulary.vocab_size
        self._bits = torch.zeros((self.vocab_size + 31) // 32, dtype=torch.int32)

    def allowed(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """``[V]`` bool: the tokens that may come next."""
        self.matcher.unsafe_compute_mask_ptr(self._bits.data_ptr(), self._bits.numel() * 4)
        if self.matcher.is_error():
            raise GrammarError(f"constrained decoding failed: {_message(self.matcher.get_error())}")
        mask = ((self._bits[:, None] >> _SHIFTS) & 1).bool().flatten()[: self.vocab_size]
        return mask.to(device, non_blocking=True)

    def advance(self, token: int) -> None:
        """Move past ``token``; a token the grammar does not allow here is a :class:`GrammarError`."""
        if self.matcher.is_stopped() and int(token) in self.grammar.vocabulary.eos_ids:
            return  # the grammar is complete and stopped: its end token ends the text
        if not self.matcher.consume_token(int(token)):
            raise GrammarError(
                f"token {int(token)} is not allowed here by the grammar: {_message(self.matcher.get_error())}"
            )


def allowed_rows(
    constraints: Sequence[Constraint | None], vocab_size: int, device: torch.device | str
) -> torch.Tensor | None:
    """``[B, V]`` bool, row ``i`` the tokens ``constraints[i]`` allows (all of them for None); None when
    no row is constrained."""
    if all(c is None for c in constraints):
        return None
    rows = [
        torch.ones(vocab_size, dtype=torch.bool) if c is None else c.allowed()[:vocab_size]
        for c in constraints
    ]
    return torch.stack(rows).to(device)
