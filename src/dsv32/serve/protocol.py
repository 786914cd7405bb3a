"""Request bodies of the OpenAI API as pydantic models: ``/v1/chat/completions`` and ``/v1/completions``.

Field names, types and ranges are OpenAI's (``temperature`` in [0, 2], ``top_p`` in (0, 1],
``top_logprobs`` in [0, 20], at most 4 ``stop`` strings, ...), plus what vLLM adds and dsv32 honours:
``top_k`` (0 or -1 = off), ``ignore_eos`` (decode to ``max_tokens``, for benchmarks) and
``chat_template_kwargs`` (``{"thinking": true}`` switches a V3.2 model
to thinking mode). The sampling bounds (``temperature``, ``top_p``, ``top_k``, ``seed``, ``max_tokens``)
are :mod:`dsv32.engine.wire`'s, which the RL route shares. Unknown fields are rejected, so a misspelt parameter is an error instead of being
ignored. Assistant messages accept their reasoning as ``reasoning_content`` or ``reasoning``.
Validation failures become 400 responses (see :mod:`dsv32.serve.app`), and so does a string that
UTF-8 cannot encode (:func:`check_text`: a lone surrogate such as ``"\\ud800"``, which JSON's ``\\u``
escapes can carry and Python's ``json.dumps`` writes), wherever it is in the body.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dsv32.chat.validate import unencodable
from dsv32.engine.wire import MaxTokens, Seed, Temperature, TopK, TopP
from dsv32.serve.errors import invalid


class _Strict(BaseModel):
    """No unknown fields, and JSON's types as they are: ``"5"`` or ``true`` is not an integer."""

    model_config = ConfigDict(extra="forbid", strict=True)


class FunctionCall(_Strict):
    name: str
    arguments: str | dict[str, Any]


class ToolCall(_Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    """One chat message. ``role`` is checked against the conversation format when the prompt is built
    (an unknown role is a 400 naming the message)."""

    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None

    def text(self) -> str | None:
        """The content as one string (text parts joined)."""
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content

    def as_dict(self) -> dict[str, Any]:
        """The message as :func:`dsv32.chat.encode_messages` and chat templates take it."""
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        reasoning = self.reasoning_content if self.reasoning_content is not None else self.reasoning
        if reasoning is not None:
            out["reasoning_content"] = reasoning
        if self.tool_calls:
            out["tool_calls"] = [tc.model_dump(exclude_none=True) for tc in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


class FunctionDef(_Strict):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        """A JSON Schema of an object, as OpenAI requires of a function's parameters."""
        if value is None:
            return value
        if value.get("type", "object") != "object":
            raise ValueError(f"parameters must be a JSON Schema of type 'object', got type {value['type']!r}")
        if not isinstance(value.get("properties", {}), dict):
            raise ValueError("parameters.properties must be an object mapping names to schemas")
        if not isinstance(value.get("required", []), list):
            raise ValueError("parameters.required must be a list of property names")
        return value


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class ResponseFormat(_Strict):
    """OpenAI's ``response_format``: plain ``text`` (the default), a ``json_object``, or a
    ``json_schema`` (``{"name", "schema", ...}``)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _schema(self):
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("response_format takes json_schema exactly when its type is 'json_schema'")
        if self.json_schema is not None and not isinstance(self.json_schema.get("schema", {}), dict):
            raise ValueError("response_format.json_schema.schema must be a JSON Schema object")
        return self


class StreamOptions(_Strict):
    include_usage: bool = False


class SamplingFields(_Strict):
    """Sampling fields shared by both endpoints; their bounds are the RL route's too
    (:mod:`dsv32.engine.wire`)."""

    model: str
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    top_k: TopK = 0
    n: int = Field(1, ge=1)
    stop: str | list[str] | None = None
    seed: Seed | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    frequency_penalty: float = Field(0.0, ge=0.0, le=0.0, description="only 0 (no penalty) is supported")
    presence_penalty: float = Field(0.0, ge=0.0, le=0.0, description="only 0 (no penalty) is supported")
    ignore_eos: bool = False
    # Keep Indexing's selections are recorded by POST /inference/v1/generate alone (it runs the engine's
    # whole-sequence generate); the continuous batch behind these endpoints records none: refused.
    return_indexer_topk: bool = False

    @field_validator("return_indexer_topk")
    @classmethod
    def _no_indexing(cls, value: bool) -> bool:
        if value:
            raise ValueError(
                "the continuous batch of /v1/completions and /v1/chat/completions does not record the "
                "DSA indexer's selections; ask POST /inference/v1/generate with "
                "sampling_params.return_indexer_topk (it records them per choice)"
            )
        return value

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: str | list[str] | None) -> list[str]:
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes at most 4 non-empty strings")
        return stops

    @model_validator(mode="after")
    def _stream_options(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(SamplingFields):
    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _checks(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        if self.tool_choice is not None and self.tool_choice != "none" and not self.tools:
            raise ValueError("tool_choice needs tools")
        names = [t.function.name for t in self.tools or []]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"tool names must be unique; given more than once: {twice}")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
            raise ValueError(
                f"tool_choice names {self.tool_choice.function.name!r}, which is not among the tools {names}"
            )
        return self

    @property
    def output_format(self) -> dict[str, Any] | None:
        """The ``response_format`` the prompt states (None for plain text, OpenAI's default)."""
        if self.response_format is None or self.response_format.type == "text":
            return None
        return self.response_format.model_dump(exclude_none=True)

    @property
    def output_schema(self) -> dict[str, Any] | None:
        """The JSON Schema the answer must follow (None for plain text): any JSON object for
        ``json_object`` (and a ``json_schema`` without ``schema``), else the ``json_schema``'s ``schema``."""
        if self.response_format is None or self.response_format.type == "text":
            return None
        schema = (self.response_format.json_schema or {}).get("schema")
        return {"type": "object"} if schema is None else schema

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def thinking(self) -> bool:
        return bool((self.chat_template_kwargs or {}).get("thinking", False))


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: MaxTokens = 16
    logprobs: int | None = Field(None, ge=0, le=5)

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value):
        if isinstance(value, list):
            if len(value) == 1 and isinstance(value[0], str | list):
                value = value[0]
            elif value and not all(isinstance(v, int) for v in value):
                raise ValueError("this server takes one prompt per request (a string or a list of token ids)")
        if not value:
            raise ValueError("the prompt is empty")
        return value


class TokenizeRequest(_Strict):
    """``POST /tokenize`` (vLLM's): a chat request's ``messages`` (with its tools) or a ``prompt``."""

    model: str
    messages: list[Message] | None = Field(None, min_length=1)
    prompt: str | None = None
    tools: list[Tool] | None = None
    tool_choice: Any = None
    chat_template_kwargs: dict[str, Any] | None = None


def _path(steps: tuple) -> str:
    """``messages[0].content`` for the steps ``("messages", 0, "content")``."""
    path = ""
    for step in steps:
        path += f"[{step}]" if isinstance(step, int) else (f".{step}" if path else str(step))
    return path


def check_text(body: BaseModel) -> None:
    """Refuse (400, OpenAI's error JSON) a request holding a string that cannot be tokenized: one with a
    lone surrogate, which UTF-8 cannot encode."""
    found = unencodable(body.model_dump(exclude_unset=True))
    if found is None:
        return
    steps, is_key, position, char = found
    path = f"a key in {_path(steps) or 'the body'}" if is_key else _path(steps)
    param = steps[0] if steps else None
    raise invalid(
        f"{path} holds the lone surrogate {char!r} (at character {position}), which UTF-8 cannot encode: "
        "send the character itself or a complete surrogate pair",
        param,
    )
