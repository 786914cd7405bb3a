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
