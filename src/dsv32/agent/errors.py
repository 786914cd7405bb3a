"""The agent's typed errors: bad configuration or tools (a user can fix them) and backend failures."""

from __future__ import annotations

from dsv32.errors import DSV32Error


class AgentError(DSV32Error, ValueError):
    """A bad agent setup: an unknown context strategy, a tool whose signature cannot become a schema,
    a tokenizer that cannot speak the chosen prompt format, a task that is not a conversation."""


class BackendError(DSV32Error, RuntimeError):
    """The model could not answer: an endpoint that kept failing after its retries or sent a malformed
    reply (the message names the field), an exhausted script. The loop turns it into
    ``stop_reason="error"``; it never escapes :meth:`Agent.run`. So does an :class:`AgentError` a
    backend raises mid-episode (a chat template that refuses the conversation)."""


class ContextLengthError(BackendError):
    """The endpoint refused the request because the prompt and the reply's ``max_tokens`` do not fit
    its context window (HTTP 400, OpenAI's ``context_length_exceeded``, vLLM's "maximum context
    length"). ``prompt_tokens``: the prompt's size when the endpoint said it. The loop treats it as
    a full context: the strategy resets it, or the episode stops with ``"context"``."""

    def __init__(self, message: str, prompt_tokens: int | None = None) -> None:
        super().__init__(message)
        self.prompt_tokens = prompt_tokens
