"""What a chat request that gives no ``max_tokens`` may generate: ``--max-tokens-default`` when the
server has one (capped to the room the prompt leaves), else the rest of the window; ``/v1/models``
says which, beside the window (``max_model_len``)."""

from __future__ import annotations

import httpx2 as httpx
from helpers.serve import client_for

USER = [{"role": "user", "content": "hi"}]


def test_a_request_without_max_tokens_gets_the_servers_default(one_thread, v32_served):
    from dsv32.serve import ServerThread, create_app

    v32_served.eos_ids = []  # the random model decodes until its budget
    with ServerThread(create_app(v32_served, max_tokens_default=7)) as server:
        client = client_for(server)
        r = client.chat.completions.create(model="tiny-v32", messages=USER, temperature=0)
        assert r.usage.completion_tokens == 7 and r.choices[0].finish_reason == "length"
        r = client.chat.completions.create(model="tiny-v32", messages=USER, temperature=0, max_tokens=9)
        assert r.usage.completion_tokens == 9  # a request's own max_tokens is not capped by the default
        card = httpx.get(server.base_url + "/models").json()["data"][0]
        assert (card["max_model_len"], card["max_tokens_default"]) == (4096, 7)
    with ServerThread(create_app(v32_served)) as server:
        card = httpx.get(server.base_url + "/models").json()["data"][0]
        assert (card["max_model_len"], card["max_tokens_default"]) == (4096, None)
