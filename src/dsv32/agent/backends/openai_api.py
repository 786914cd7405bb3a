"""Any OpenAI-compatible chat endpoint through the official ``openai`` client: DeepSeek's API, vLLM
(with its ``deepseek_v32`` tool parser), ``dsv32 serve``.

What goes out (:func:`request_messages`): the conversation with the thinking context of §3.2.1 —
``reasoning_content`` is sent back on the assistant turns after the last user message (the tool
calls of the current turn, as DeepSeek's API requires) and dropped on earlier turns (and everywhere
in chat mode); only the keys the Chat Completions API knows are sent. ``thinking`` becomes
``chat_template_kwargs: {"thinking": ...}`` (vLLM and SGLang pass it to the chat template);
sampling keys the client does not know (``top_k``, ``min_p``, ...) travel in ``extra_body``.

What comes back: ``reasoning_content`` or ``reasoning`` (vLLM's newer name), content, tool calls,
usage (``prompt_tokens_details.cached_tokens`` as cached tokens) and the finish reason, streamed or
not. Retries with exponential backoff on 408/409/429/5xx, connection errors and timeouts are the
client's own (``max_retries``; it honours ``Retry-After``); what still fails becomes a
:class:`~dsv32.agent.errors.BackendError`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from dsv32.agent.backends.base import (
    Completion,
    Delta,
    TokenEstimator,
    Usage,
    assistant_message,
    reply_tokens,
    send_whole,
    visible_messages,
)
from dsv32.agent.errors import BackendError

#: Keyword arguments of ``client.chat.completions.create``; other sampling keys go in ``extra_body``.
CLIENT_PARAMS = frozenset(
    [
        "temperature",
        "top_p",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "n",
        "logprobs",
        "top_logprobs",
        "logit_bias",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "reasoning_effort",
        "user",
        "service_tier",
    ]
)
_SENT_KEYS = {
    "system": ("role", "content"),
    "user": ("role", "content", "name"),
    "developer": ("role", "content"),
    "assistant": ("role", "content", "tool_calls", "reasoning_content"),
    "tool": ("role", "tool_call_id", "content"),
}


def request_messages(messages: Sequence[dict], thinking: bool) -> list[dict]:
    """The messages as sent: §3.2.1's thinking context, API keys only."""
    out = []
    for message in visible_messages(messages, thinking):
        keys = _SENT_KEYS.get(message.get("role"), tuple(message))
        sent = {k: message[k] for k in keys if message.get(k) is not None}
        if sent.get("role") == "assistant" and not sent.get("reasoning_content"):
            sent.pop("reasoning_content", None)
        out.append(sent)
    return out


def _extra(obj: Any, *names: str) -> Any:
    """The first of ``names`` set on a response object (fields the client's models do not declare)."""
    for name in names:
        value = getattr(obj, name, None)
        if value:
            return value
    return None


class OpenAIBackend:
    """``OpenAIBackend(base_url, model, api_key=None, **sampling)``.

    ``api_key`` defaults to ``$OPENAI_API_KEY``, else ``"EMPTY"`` (what keyless local servers such as
    vLLM accept). ``stream=True`` streams the reply (``on_delta`` sees it as it arrives).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        stream: bool = False,
        max_retries: int = 5,
        timeout_s: float = 600.0,
        send_thinking: bool = True,
        extra_body: dict | None = None,
        client: Any = None,
        **sampling: Any,
    ) -> None:
        import openai

        self.base_url, self.model, self.stream = base_url, model, stream
        self.max_retries = max_retries
        self.send_thinking = send_thinking
        self.extra_body = dict(extra_body or {})
        self.sampling = sampling
        key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self.client = client or openai.OpenAI(
            base_url=base_url, api_key=key, max_retries=max_retries, timeout=timeout_s
        )
        self.estimate = TokenEstimator()

    def count_tokens(self, messages: Sequence[dict], tools: Sequence[dict], *, thinking: bool = True) -> int:
        return self.estimate(messages, tools)

    def _request(
        self, messages: Sequence[dict], tools: Sequence[dict], thinking: bool, sampling: dict
    ) -> dict:
        settings = {**self.sampling, **sampling}
        extra = dict(self.extra_body)
        extra.update({k: v for k, v in settings.items() if k not in CLIENT_PARAMS})
        if self.send_thinking:
            extra["chat_template_kwargs"] = {**extra.get("chat_template_kwargs", {}), "thinking": thinking}
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": request_messages(messages, thinking),
            **{k: v for k, v in settings.items() if k in CLIENT_PARAMS},
        }
        if tools:
            kwargs["tools"] = list(tools)
        if extra:
            kwargs["extra_body"] = extra
        return kwargs

    def complete(
        self,
        messages: Sequence[dict],
        tools: Sequence[dict],
        *,
        thinking: bool = True,
        sampling: dict | None = None,
        on_delta: Delta | None = None,
    ) -> Completion:
        import openai

        kwargs = self._request(messages, tools, thinking, sampling or {})
        start = time.perf_counter()
        try:
            if self.stream:
                message, usage, finish = self._streamed(kwargs, on_delta)
            else:
                message, usage, finish = self._whole(kwargs, on_delta)
        except openai.APIStatusError as err:
            raise BackendError(
                f"{self.base_url} answered HTTP {err.status_code} (after up to {self.max_retries} retries): "
                f"{err.message}"
                + (" — check api_key / OPENAI_API_KEY" if err.status_code in (401, 403) else "")
            ) from err
        except (openai.APIConnectionError, openai.APIResponseValidationError) as err:
            raise BackendError(f"{self.base_url}: {err} (after up to {self.max_retries} retries)") from err
        latency = time.perf_counter() - start
        if usage.prompt_tokens:
            self.estimate.calibrate(messages, tools, usage.prompt_tokens)
        else:
            usage.prompt_tokens = self.estimate(messages, tools)
        if not usage.completion_tokens:
            usage.completion_tokens = reply_tokens(message)
        return Completion(message, usage, finish, latency)

    def _whole(self, kwargs: dict, on_delta: Delta | None) -> tuple[dict, Usage, str | None]:
        response = self.client.chat.completions.create(**kwargs)
        if not response.choices:
            raise BackendError(f"{self.base_url} returned no choices")
        choice = response.choices[0]
        raw = choice.message
        calls = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": c.function.arguments},
            }
            for c in raw.tool_calls or []
        ]
        message = assistant_message(raw.content, _extra(raw, "reasoning_content", "reasoning"), calls)
        send_whole(message, on_delta)
        return message, _usage(response.usage), choice.finish_reason

    def _streamed(self, kwargs: dict, on_delta: Delta | None) -> tuple[dict, Usage, str | None]:
        stream = self.client.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )
        reasoning, content, calls, usage, finish = [], [], {}, Usage(), None
        for chunk in stream:
            if chunk.usage is not None:
                usage = _usage(chunk.usage)
            for choice in chunk.choices:
                delta = choice.delta
                finish = choice.finish_reason or finish
                text = _extra(delta, "reasoning_content", "reasoning")
                if text:
                    reasoning.append(text)
                    if on_delta is not None:
                        on_delta("reasoning", text)
                if delta.content:
                    content.append(delta.content)
                    if on_delta is not None:
                        on_delta("content", delta.content)
                for part in delta.tool_calls or []:
                    call = calls.setdefault(part.index, {"id": None, "name": "", "arguments": ""})
                    call["id"] = part.id or call["id"]
                    if part.function is not None:
                        call["name"] += part.function.name or ""
                        call["arguments"] += part.function.arguments or ""
        tool_calls = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for _, c in sorted(calls.items())
        ]
        return assistant_message("".join(content), "".join(reasoning), tool_calls), usage, finish


def _usage(raw: Any) -> Usage:
    if raw is None:
        return Usage()
    details = getattr(raw, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) or 0
    return Usage(raw.prompt_tokens or 0, raw.completion_tokens or 0, cached)
