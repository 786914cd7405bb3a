"""Untrusted text in prompts: special-token strings removed before the text is tokenized.

A tokenizer turns the text of a special token (``<｜User｜>``, ``<｜end▁of▁sentence｜>``, ...) into
that token's id wherever it appears, so text that holds one can open a turn of its own in the
prompt. Tool results are such text: :func:`strip_tool_results` removes the tokens from them before
a conversation is encoded (the agent's backends and the server do). :func:`encode_messages` and
:func:`tokenize_conversation` themselves take text verbatim.

No import of transformers here: :func:`tokenizer_special_tokens` reads the tokenizer object.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dsv32.chat import protocol as P

#: What is removed from tool results by default: the V3.2 special tokens and the DSML tag, which
#: :func:`~dsv32.chat.add_v32_special_tokens` registers as a special token too.
UNTRUSTED_TOKENS: tuple[str, ...] = P.SPECIAL_TOKENS + P.EXTRA_TOKENS


def strip_special_tokens(text: str, tokens: Iterable[str] = UNTRUSTED_TOKENS) -> str:
    """``text`` with every occurrence of ``tokens`` removed, until none is left.

    Removing one token can join the text around it into another (``<｜Us<｜User｜>er｜>``), so the
    text is read once, character by character, and a token is removed as soon as the text kept so
    far ends with it: what remains holds none of ``tokens``.
    """
    tokens = {t for t in tokens if t}
    if not any(t in text for t in tokens):
        return text
    by_last: dict[str, list[str]] = {}
    for token in sorted(tokens, key=len, reverse=True):
        by_last.setdefault(token[-1], []).append(token)
    longest = max(map(len, tokens))
    kept: list[str] = []
    for char in text:
        kept.append(char)
        for token in by_last.get(char, ()):
            if "".join(kept[-longest:]).endswith(token):
                del kept[-len(token) :]
                break
    return "".join(kept)


def strip_tool_results(messages: Sequence[dict], tokens: Iterable[str] = UNTRUSTED_TOKENS) -> list[dict]:
    """``messages`` with ``tokens`` stripped from the string content of tool results (copies of the
    messages that change; every other message is passed as it is)."""
    tokens = tuple(tokens)
    out = []
    for message in messages:
        content = message.get("content")
        if message.get("role") == "tool" and isinstance(content, str):
            stripped = strip_special_tokens(content, tokens)
            if stripped != content:
                message = {**message, "content": stripped}
        out.append(message)
    return out


class ToolResultStripper:
    """:func:`strip_tool_results` for a conversation that grows call after call: each tool result's
    text is scanned once, not at every call (a result whose content is the same string object as in
    the previous call is taken from there; strings cannot change)."""

    def __init__(self, tokens: Iterable[str] = UNTRUSTED_TOKENS) -> None:
        self.tokens = tuple(tokens)
        self._seen: dict[int, tuple[str, str]] = {}  # id(content) -> (content, stripped)

    def __call__(self, messages: Sequence[dict]) -> list[dict]:
        seen: dict[int, tuple[str, str]] = {}
        out = []
        for message in messages:
            content = message.get("content") if isinstance(message, Mapping) else None
            if isinstance(content, str) and message.get("role") == "tool":
                known = self._seen.get(id(content))
                if known is None or known[0] is not content:
                    known = (content, strip_special_tokens(content, self.tokens))
                seen[id(content)] = known
                if known[1] is not content:
                    message = {**message, "content": known[1]}
            out.append(message)
        self._seen = seen
        return out


def tokenizer_special_tokens(tokenizer: Any) -> list[str]:
    """The special tokens of a Hugging Face tokenizer: ``all_special_tokens`` and the added tokens
    marked special (``<|im_start|>``, ``<|im_end|>``, ... of a chat model)."""
    tokens = set(getattr(tokenizer, "all_special_tokens", None) or ())
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    tokens.update(t.content for t in added.values() if getattr(t, "special", False))
    return sorted(t for t in tokens if isinstance(t, str) and t)
