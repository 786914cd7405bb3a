"""Helpers the serve tests import by name (not from ``conftest``: another test folder has one too)."""

from __future__ import annotations


def client_for(server, api_key: str = "none", **kwargs):
    """The official ``openai`` client for a test server, without retries."""
    import openai

    return openai.OpenAI(base_url=server.base_url, api_key=api_key, max_retries=0, **kwargs)
