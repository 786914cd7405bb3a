"""Token ids and loss masks for training on V3.2 conversations, with any Hugging Face tokenizer.

No import of transformers here: functions receive a tokenizer object and use only
``tokenizer.encode(text, add_special_tokens=False)``, ``tokenizer.get_added_vocab()`` and
``tokenizer.add_tokens(tokens, special_tokens=True)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from dsv32.chat import protocol as P
from dsv32.chat.context import last_user_index
from dsv32.chat.encode import render_segments
from dsv32.errors import DSV32Error


class TokenizerError(DSV32Error, ValueError):
    """The tokenizer cannot represent the V3.2 format faithfully (special tokens missing)."""


def missing_special_tokens(tokenizer: Any, tokens: Sequence[str] = P.SPECIAL_TOKENS) -> list[str]:
    """The V3.2 tokens that ``tokenizer`` does not treat as single, unsplittable (added) tokens."""
    if not callable(getattr(tokenizer, "get_added_vocab", None)):
        raise TokenizerError(
            f"expected a Hugging Face tokenizer (with get_added_vocab), got {type(tokenizer).__name__}"
        )
    added = tokenizer.get_added_vocab()
    return [token for token in tokens if token not in added]


def add_v32_special_tokens(tokenizer: Any) -> list[str]:
    """Register the V3.2 special tokens (and the DSML tag) with a tokenizer that lacks them.

    Explicit on purpose: new tokens need new embedding rows. Returns the tokens that were added
    (empty when the tokenizer already had them all); when it is not empty, resize the model, e.g.
    ``model.resize_token_embeddings(len(tokenizer))``. The tokens are added as special tokens, so
    decode completions with ``skip_special_tokens=False`` before :func:`parse_completion`.
    """
    missing = missing_special_tokens(tokenizer, P.SPECIAL_TOKENS + P.EXTRA_TOKENS)
    if missing:
        tokenizer.add_tokens(missing, special_tokens=True)
    return missing


def tokenize_conversation(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    thinking_mode: str = "thinking",
    *,
    add_bos: bool = True,
    train_on: Literal["all", "last_round"] = "all",
) -> tuple[list[int], list[int]]:
    """Encode a conversation and mark what the assistant generated.

    Returns ``(input_ids, loss_mask)`` of equal length; ``loss_mask[t]`` is 1 exactly for tokens of
    assistant turns: reasoning and its ``</think>`` (thinking mode, turns after the last user
    message), content, DSML tool calls and the end token. Prompts, system text, the ``<think>`` /
    ``</think>`` that close user turns and tool results are 0.

    ``train_on="last_round"`` masks only the assistant turns after the last user message (the ones
    that keep their reasoning in thinking mode); ``"all"`` also trains earlier turns as they are
    rendered (without their dropped reasoning).

    The text is tokenized in chunks that alternate between prompt and generated text. A generated
    chunk starts after ``<think>``/``</think>`` (or an end token) and ends with the end token, so with
    the special tokens registered the ids equal tokenizing the whole text at once (the exception is
    an assistant turn directly after a system message, which no V3.2 conversation has).
    Raises :class:`TokenizerError` when the tokenizer lacks the V3.2 special tokens (see
    :func:`add_v32_special_tokens`) and ``ConversationError`` for bad messages.
    """
    if train_on not in ("all", "last_round"):
        raise ValueError(f"train_on must be 'all' or 'last_round', got {train_on!r}")
    missing = missing_special_tokens(tokenizer)
    if missing:
        raise TokenizerError(
            f"the tokenizer lacks the V3.2 special tokens {missing}; call "
            "dsv32.chat.add_v32_special_tokens(tokenizer) and resize the model's embeddings to len(tokenizer)"
        )
    segments = render_segments(messages, thinking_mode, None, True, add_bos)
    last_user = last_user_index(messages)

    def trained(segment: Any) -> bool:
        if not segment.generated:
            return False
        return train_on == "all" or segment.index > last_user

    chunks: list[tuple[str, bool]] = []
    for segment in segments:
        flag = trained(segment)
        if chunks and chunks[-1][1] == flag:
            chunks[-1] = (chunks[-1][0] + segment.text, flag)
        else:
            chunks.append((segment.text, flag))
    input_ids: list[int] = []
    loss_mask: list[int] = []
    for text, flag in chunks:
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        input_ids.extend(ids)
        loss_mask.extend([int(flag)] * len(ids))
    return input_ids, loss_mask
