"""The continuous batch of the OpenAI endpoints records no DSA indexer selections: a request for them
(``return_indexer_topk``) is a 400 that names the field and the route that records them, and the
server goes on serving; ``false`` is the default and accepted."""

from __future__ import annotations

import openai
import pytest
from helpers.serve import client_for

MODEL = "tiny-v32"
USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_return_indexer_topk_on_the_continuous_batch_is_a_400(v32_server, endpoint):
    client = client_for(v32_server)

    def ask(flag: bool):
        extra = {"return_indexer_topk": flag}
        if endpoint == "chat":
            return client.chat.completions.create(model=MODEL, messages=USER, max_tokens=2, extra_body=extra)
        return client.completions.create(model=MODEL, prompt="hi", max_tokens=2, extra_body=extra)

    with pytest.raises(openai.BadRequestError) as info:
        ask(True)
    body = info.value.body
    assert info.value.status_code == 400 and body["param"] == "return_indexer_topk", body
    assert "does not record" in body["message"] and "/inference/v1/generate" in body["message"], body
    assert ask(False).choices  # the default, accepted; the server serves on
