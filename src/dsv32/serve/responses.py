"""Response bodies of the OpenAI API: chat completions and their stream chunks, text completions.

A V3.2 message carries its reasoning twice, as ``reasoning_content`` and ``reasoning`` (vLLM's newer
name); ``content`` is ``null`` when the turn is only tool calls, and ``finish_reason`` is
``"tool_calls"`` when a turn that ended on its own made calls (a turn cut at ``max_tokens`` stays
``"length"``).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from dsv32.serve.stream import MessageDelta


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def finish_reason(reason: str, message: dict[str, Any]) -> str:
    return "tool_calls" if reason == "stop" and message["tool_calls"] else reason


def chat_message(message: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI assistant message of a parsed completion."""
    reasoning = message["reasoning_content"] or None
    content = message["content"]
    if not content and message["tool_calls"]:
        content = None
    return {
        "role": "assistant",
        "content": content,
        "reasoning_content": reasoning,
        "reasoning": reasoning,
        "tool_calls": message["tool_calls"],
    }


def _body(
    rid: str, kind: str, model: str, choices: list[dict[str, Any]], usage_: dict | None
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage_,
    }


def chat_completion(
    rid: str, model: str, choices: list[dict[str, Any]], prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    return _body(rid, "chat.completion", model, choices, usage(prompt_tokens, completion_tokens))


def chat_choice(index: int, message: dict[str, Any], reason: str, logprobs: list | None) -> dict[str, Any]:
    return {
        "index": index,
        "message": chat_message(message),
        "logprobs": None if logprobs is None else {"content": logprobs},
        "finish_reason": finish_reason(reason, message),
    }


def chat_chunk(
    rid: str, model: str, choice: dict[str, Any] | None, usage_: dict | None = None
) -> dict[str, Any]:
    return _body(rid, "chat.completion.chunk", model, [] if choice is None else [choice], usage_)


def stream_choice(index: int, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


def delta_choices(index: int, delta: MessageDelta) -> list[dict[str, Any]]:
    """One stream choice per piece of ``delta``: reasoning, content, then each tool-call delta."""
    parts: list[dict[str, Any]] = []
    if delta.reasoning:
        parts.append({"reasoning_content": delta.reasoning, "reasoning": delta.reasoning})
    if delta.content:
        parts.append({"content": delta.content})
    parts += [{"tool_calls": [tc]} for tc in delta.tool_calls]
    return [stream_choice(index, p) for p in parts]


def completion_logprobs(entries: list[dict[str, Any]], offset: int = 0) -> dict[str, Any]:
    """Chat-style log-prob entries in the legacy completions layout."""
    offsets, position = [], offset
    for e in entries:
        offsets.append(position)
        position += len(e["token"])
    return {
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
        "text_offset": offsets,
    }


def completion_body(
    rid: str,
    model: str,
    choices: list[dict[str, Any]],
    prompt_tokens: int,
    completion_tokens: int,
    chunk: bool,
) -> dict[str, Any]:
    return _body(
        rid, "text_completion", model, choices, None if chunk else usage(prompt_tokens, completion_tokens)
    )
