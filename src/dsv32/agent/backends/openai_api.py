"""Any OpenAI-compatible chat endpoint through the official ``openai`` client: DeepSeek's API, vLLM
(with its ``deepseek_v32`` tool parser), ``dsv32 serve``.

What goes out (:func:`request_messages`): the conversation with the thinking context of §3.2.1 —
``reasoning_content`` is sent back on the assistant turns after the last user message (the tool
calls of the current turn, as DeepSeek's API requires) and dropped on earlier turns (and everywhere
in chat mode); only the keys the Chat Completions API knows are sent; tool results go without the
V3.2 special-token strings (:func:`dsv32.chat.strip_tool_results`: a server that renders the V3.2
format would turn them into tokens). ``thinking`` becomes
``chat_template_kwargs: {"thinking": ...}`` (vLLM and SGLang pass it to the chat template);
sampling keys the client does not know (``top_k``, ``min_p``, ...) travel in ``extra_body``.

What comes back: ``reasoning_content`` or ``reasoning`` (vLLM's newer name), content, tool calls,
usage (``prompt_tokens_details.cached_tokens`` as cached tokens) and the finish reason, streamed or
not. Retries with exponential backoff on 408/409/429/5xx, connection errors and timeouts are the
client's own (``max_retries``; it honours ``Retry-After``); what still fails becomes a
:class:`~dsv32.agent.errors.BackendError` — a refusal for the context length (HTTP 400 with OpenAI's
``context_length_exceeded`` code or vLLM's "maximum context length" words) a
:class:`~dsv32.agent.errors.ContextLengthError`, after which the loop manages the context.

Replies are read as plain JSON (the client does not validate them) and checked field by field
(:func:`~dsv32.agent.backends.base.reply_message`): a body that is not a chat completion, no
choices, a choice without a message, ``tool_calls`` that is not a list, a call or its ``function``
that is not an object, a string field that is not a string, a usage count that is not an integer,
a body or stream event that is not JSON, an error object in a 200 reply or in the stream — each
becomes a ``BackendError`` naming the field (the episode stops with ``"error"`` and keeps what it
has). What the model wrote inside a call is kept for the toolbox to answer: a missing name (``""``),
null arguments (``"{}"``), arguments sent as a JSON value instead of a string (written as JSON: an
object is read as usual, anything else is answered as ``bad_json``). ``content`` as a list of text
parts is joined. Streamed tool-call parts without an ``index`` start a new call when they carry a
new ``id`` and continue the last one otherwise; choices other than the first are ignored; a stream
that ends before its first choice has a ``finish_reason`` was cut short and is a ``BackendError``.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import time
from collections.abc import Sequence
from typing import Any

from dsv32.agent.backends.base import (
    Completion,
    Delta,
    MalformedReply,
    TokenEstimator,
    Usage,
    arguments_text,
    at,
    optional_string,
    reply_message,
    reply_text,
    reply_tokens,
    sampling_settings,
    send_whole,
    token_count,
    visible_messages,
    wrong,
)
from dsv32.agent.errors import BackendError, ContextLengthError
from dsv32.chat import strip_tool_results

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
    """The messages as sent: §3.2.1's thinking context, API keys only, tool results stripped of the
    V3.2 special tokens."""
    out = []
    for message in strip_tool_results(visible_messages(messages, thinking)):
        keys = _SENT_KEYS.get(message.get("role"), tuple(message))
        sent = {k: message[k] for k in keys if message.get(k) is not None}
        if sent.get("role") == "assistant" and not sent.get("reasoning_content"):
            sent.pop("reasoning_content", None)
        out.append(sent)
    return out


#: How endpoints say that prompt + max_tokens do not fit: OpenAI's error code, and the words of
#: OpenAI, vLLM ("This model's maximum context length is ...", "... longer than the maximum model
#: length"), SGLang and ``dsv32 serve``.
_CONTEXT_CODE = "context_length_exceeded"
_CONTEXT_WORDS = re.compile(
    r"maximum context length|context length|context window|maximum model length|prompt is too long", re.I
)
#: Where those messages give the prompt's size.
_PROMPT_SIZE = re.compile(
    r"(\d+) (?:tokens )?in the (?:messages|prompt)|request has (\d+) input tokens|"
    r"messages resulted in (\d+) tokens|prompt \(length (\d+)\)"
)


def context_length_refusal(err: Any) -> bool:
    """Whether an HTTP error of the client says the request does not fit the model's window."""
    return getattr(err, "code", None) == _CONTEXT_CODE or bool(_CONTEXT_WORDS.search(str(err.message)))


def refused_prompt_tokens(message: str) -> int | None:
    """The prompt's token count in a context-length refusal, when it gives one."""
    match = _PROMPT_SIZE.search(message or "")
    return int(next(g for g in match.groups() if g)) if match else None


#: Where endpoints put the reasoning: DeepSeek's API and older vLLM, vLLM's newer name.
REASONING_KEYS = ("reasoning_content", "reasoning")


def _plain(value: Any) -> Any:
    """A response object of the client as the JSON it was built from. The client builds its models
    without validation, so a field may hold anything the server sent; reading the plain values
    lets every field be checked."""
    from pydantic import BaseModel

    if isinstance(value, BaseModel):
        fields = {**value.__dict__, **(value.__pydantic_extra__ or {})}
        return {k: _plain(v) for k, v in fields.items()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _read(produce: Any, what: str) -> Any:
    """``_plain(produce())``, with a body the client could not decode (not JSON, nested too deeply)
    as :class:`MalformedReply`."""
    try:
        return _plain(produce())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise MalformedReply(f"{what} is not readable JSON ({type(err).__name__}: {err})") from err


def _error_text(error: Any) -> str:
    message = error.get("message") if isinstance(error, dict) else error
    return message if isinstance(message, str) and message else json.dumps(error, default=str)[:500]


def _usage(raw: Any, where: str) -> Usage:
    if raw is None:
        return Usage()
    if not isinstance(raw, dict):
        raise wrong(where, raw, "a usage object or null")
    details = raw.get("prompt_tokens_details")
    if details is not None and not isinstance(details, dict):
        raise wrong(at(where, "prompt_tokens_details"), details, "an object or null")
    return Usage(
        token_count(raw.get("prompt_tokens"), at(where, "prompt_tokens")),
        token_count(raw.get("completion_tokens"), at(where, "completion_tokens")),
        token_count(
            (details or {}).get("cached_tokens"), at(at(where, "prompt_tokens_details"), "cached_tokens")
        ),
    )


class _Refused(Exception):
    """The endpoint answered without a reply: an error object in a 200 body, no choices. The text
    follows the base URL in the :class:`BackendError`."""


def _choices(data: Any, name: str, what: str) -> list:
    """The ``choices`` of ``data``: the response body (``name``), a completion (``what``), or a chunk."""
    if not isinstance(data, dict):
        raise wrong(name, data, what)
    choices = data.get("choices")
    if not isinstance(choices, list) and data.get("error") is not None:
        raise _Refused(f"answered with an error: {_error_text(data['error'])}")
    if not isinstance(choices, list):
        raise wrong("choices", choices, "a list of choices")
    return choices


def _chunks(stream: Any) -> Any:
    """``(n, chunk)`` for the stream's chunks as plain JSON; an event that is not JSON is a
    :class:`MalformedReply`."""
    events = iter(stream)
    for n in itertools.count():
        try:
            chunk = _read(lambda: next(events), f"stream event {n}")
        except StopIteration:
            return
        yield n, chunk


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
        self.sampling = sampling_settings(sampling)
        key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self.client = client or openai.OpenAI(
            base_url=base_url, api_key=key, max_retries=max_retries, timeout=timeout_s
        )
        self.estimate = TokenEstimator()

    def count_tokens(self, messages: Sequence[dict], tools: Sequence[dict], *, thinking: bool = True) -> int:
        return self.estimate(messages, tools)

    def reply_budget(self, sampling: dict | None = None) -> int | None:
        """The ``max_tokens`` (or ``max_completion_tokens``) a call with these settings sends; None
        when it sends none (the endpoint's default)."""
        settings = {**self.sampling, **sampling_settings(sampling or {})}
        budget = settings.get("max_tokens", settings.get("max_completion_tokens"))
        return None if budget is None else int(budget)

    def _request(
        self, messages: Sequence[dict], tools: Sequence[dict], thinking: bool, sampling: dict
    ) -> dict:
        settings = {**self.sampling, **sampling_settings(sampling)}
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
            if err.status_code in (400, 413) and context_length_refusal(err):
                prompt_tokens = refused_prompt_tokens(err.message)
                if prompt_tokens:
                    self.estimate.calibrate(messages, tools, prompt_tokens)
                raise ContextLengthError(
                    f"{self.base_url} refused the request for its context length (HTTP {err.status_code}): "
                    f"{err.message}",
                    prompt_tokens,
                ) from err
            retried = err.status_code in (408, 409, 429) or err.status_code >= 500  # what the client retries
            raise BackendError(
                f"{self.base_url} answered HTTP {err.status_code}"
                + (f" (after up to {self.max_retries} retries)" if retried else "")
                + f": {err.message}"
                + (" — check api_key / OPENAI_API_KEY" if err.status_code in (401, 403) else "")
            ) from err
        except (openai.APIConnectionError, openai.APIResponseValidationError) as err:
            raise BackendError(f"{self.base_url}: {err} (after up to {self.max_retries} retries)") from err
        except openai.APIError as err:  # an error event in a stream
            raise BackendError(f"{self.base_url} answered with an error: {err.message}") from err
        except MalformedReply as err:
            raise BackendError(
                f"{self.base_url} sent a reply that is not a valid chat completion: {err}"
            ) from err
        except _Refused as err:
            raise BackendError(f"{self.base_url} {err}") from err
        latency = time.perf_counter() - start
        if usage.prompt_tokens:
            self.estimate.calibrate(messages, tools, usage.prompt_tokens)
        else:
            usage.prompt_tokens = self.estimate(messages, tools)
        if not usage.completion_tokens:
            usage.completion_tokens = reply_tokens(message)
        return Completion(message, usage, finish, latency)

    def _whole(self, kwargs: dict, on_delta: Delta | None) -> tuple[dict, Usage, str | None]:
        data = _read(lambda: self.client.chat.completions.create(**kwargs), "the response body")
        choices = _choices(data, "the response body", "a chat completion object")
        if not choices:
            raise _Refused("returned no choices")
        choice = choices[0]
        if not isinstance(choice, dict):
            raise wrong("choices[0]", choice, "a choice object")
        message = reply_message(choice.get("message"), "choices[0].message", REASONING_KEYS)
        finish = optional_string(choice.get("finish_reason"), "choices[0].finish_reason")
        usage = _usage(data.get("usage"), "usage")
        send_whole(message, on_delta)
        return message, usage, finish

    def _streamed(self, kwargs: dict, on_delta: Delta | None) -> tuple[dict, Usage, str | None]:
        stream = self.client.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )
        reply = {"reasoning": [], "content": [], "calls": {}, "usage": Usage(), "finish": None}
        seen = False
        for n, chunk in _chunks(stream):
            try:
                seen = self._take_chunk(chunk, reply, on_delta) or seen
            except MalformedReply as err:
                raise MalformedReply(f"stream event {n}: {err}") from err
        if not seen:
            raise _Refused("streamed no choices")
        if reply["finish"] is None:  # a stream cut short ends like a finished one, without the reason
            raise _Refused("ended the stream before the reply finished (no finish_reason)")
        tool_calls = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for _, c in sorted(reply["calls"].items())
        ]
        message = {
            "content": "".join(reply["content"]),
            "reasoning_content": "".join(reply["reasoning"]),
            "tool_calls": tool_calls,
        }
        return reply_message(message, "the streamed message"), reply["usage"], reply["finish"]

    def _take_chunk(self, chunk: Any, reply: dict, on_delta: Delta | None) -> bool:
        """Add one checked chunk to ``reply``; whether it held the first choice."""
        if isinstance(chunk, dict) and chunk.get("choices") is None and chunk.get("error") is None:
            choices = []  # a usage-only chunk
        else:
            choices = _choices(chunk, "the chunk", "a chat completion chunk object")
        if chunk.get("usage") is not None:
            reply["usage"] = _usage(chunk["usage"], "usage")
        seen = False
        for i, choice in enumerate(choices):
            where = at("choices", i)
            if not isinstance(choice, dict):
                raise wrong(where, choice, "a choice object")
            index = choice.get("index")
            if index is not None and (not isinstance(index, int) or isinstance(index, bool)):
                raise wrong(at(where, "index"), index, "an integer")
            if index:  # another choice of n > 1
                continue
            seen = True
            finish = optional_string(choice.get("finish_reason"), at(where, "finish_reason"))
            reply["finish"] = finish or reply["finish"]
            delta = choice.get("delta")
            if delta is None:
                continue
            if not isinstance(delta, dict):
                raise wrong(at(where, "delta"), delta, "a delta object")
            self._take_delta(delta, at(where, "delta"), reply, on_delta)
        return seen

    @staticmethod
    def _take_delta(delta: dict, where: str, reply: dict, on_delta: Delta | None) -> None:
        """Add one checked delta to the reply being assembled, passing its text to ``on_delta``."""
        reasoning = ""
        for key in REASONING_KEYS:
            reasoning = reasoning or optional_string(delta.get(key), at(where, key)) or ""
        for kind, text in (
            ("reasoning", reasoning),
            ("content", reply_text(delta.get("content"), at(where, "content"))),
        ):
            if text:
                reply[kind].append(text)
                if on_delta is not None:
                    on_delta(kind, text)
        parts = delta.get("tool_calls")
        if parts is not None and not isinstance(parts, list):
            raise wrong(at(where, "tool_calls"), parts, "a list of tool call parts or null")
        calls = reply["calls"]
        for k, part in enumerate(parts or []):
            spot = at(at(where, "tool_calls"), k)
            if not isinstance(part, dict):
                raise wrong(spot, part, "a tool call part object")
            call_id = optional_string(part.get("id"), at(spot, "id"))
            index = part.get("index")
            if index is None:  # a server that sends no indexes: a new id starts a new call
                last = max(calls, default=None)
                continues = last is not None and (not call_id or call_id == calls[last]["id"])
                index = last if continues else (-1 if last is None else last) + 1
            elif not isinstance(index, int) or isinstance(index, bool) or index < 0:
                raise wrong(at(spot, "index"), index, "a non-negative integer")
            call = calls.setdefault(index, {"id": None, "name": "", "arguments": ""})
            call["id"] = call_id or call["id"]
            function = part.get("function")
            if function is None:
                continue
            if not isinstance(function, dict):
                raise wrong(at(spot, "function"), function, "an object or null")
            call["name"] += optional_string(function.get("name"), at(at(spot, "function"), "name")) or ""
            arguments = function.get("arguments")
            if arguments is not None:
                call["arguments"] += arguments_text(arguments, at(at(spot, "function"), "arguments"))
