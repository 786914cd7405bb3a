"""Errors the server answers with, in OpenAI's error JSON: ``{"error": {"message", "type", "param", "code"}}``.

Every problem a request can have is a :class:`ServeError` carrying its HTTP status: 400 for an
invalid request (``code`` ``context_length_exceeded`` when prompt + ``max_tokens`` do not fit), 401
for a wrong API key, 404 for an unknown model, 503 when the queue is full or the server is shutting
down.
"""

from __future__ import annotations

from typing import Any

from dsv32.errors import DSV32Error


class ServeError(DSV32Error, ValueError):
    """A request the server refuses; :meth:`body` is the OpenAI error object."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(message: str, param: str | None = None, code: str | None = None) -> ServeError:
    return ServeError(message, param=param, code=code)


def unknown_model(name: str, served: str) -> ServeError:
    return ServeError(
        f"The model `{name}` does not exist; this server serves `{served}` (see GET /v1/models).",
        status=404,
        param="model",
        code="model_not_found",
    )


def context_length_exceeded(
    prompt_tokens: int, max_tokens: int, max_model_len: int, param: str
) -> ServeError:
    return ServeError(
        f"This model's maximum context length is {max_model_len} tokens. However, you requested "
        f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} for the "
        "completion). Please reduce the length of the prompt or max_tokens.",
        param=param,
        code="context_length_exceeded",
    )


def unauthorized() -> ServeError:
    return ServeError(
        "Incorrect API key provided: pass the key the server was started with (--api-key) as a Bearer token.",
        status=401,
        code="invalid_api_key",
    )


def queue_full(limit: int) -> ServeError:
    return ServeError(
        f"The server is overloaded: {limit} requests are already waiting. Retry later.",
        status=503,
        type="server_error",
        code="queue_full",
    )


def shutting_down() -> ServeError:
    return ServeError(
        "The server is shutting down; retry on another instance or after it restarts.",
        status=503,
        type="server_error",
        code="shutting_down",
    )
