"""What the serve tests share: the official client for a test server, waiting for a condition."""

from __future__ import annotations

import time


def client_for(server, api_key: str = "none", **kwargs):
    """The official ``openai`` client for a test server, without retries."""
    import openai

    return openai.OpenAI(base_url=server.base_url, api_key=api_key, max_retries=0, **kwargs)


def wait_for(condition, timeout: float = 60.0) -> float:
    """Seconds until ``condition()`` held (polled every 10 ms); fails the test after ``timeout``."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout, "timed out"
        time.sleep(0.01)
    return time.monotonic() - start
