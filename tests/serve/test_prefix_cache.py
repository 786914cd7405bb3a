"""``dsv32 serve``'s prefix cache across requests: a prompt that begins as an earlier prompt or
conversation decodes what it decodes on a server without the cache, its hits are in ``/metrics``, its
memory stays under the bound, and a weight update empties it."""

from __future__ import annotations

import re
import threading
import time

import httpx2 as httpx
import pytest

pytest.importorskip("transformers")

from dsv32.engine.weight_files import save_weights

FIRST = [5, 9, 12, 40, 7, 3, 22, 17, 31, 60, 61, 62]


@pytest.fixture(scope="module")
def served(one_thread):
    from dsv32.serve import load_served

    return load_served("tiny-llama", device="cpu")


def _server(served, **kwargs):
    from dsv32.serve import ServerThread, create_app

    app = create_app(served, max_batch=4, rl_routes=True, **kwargs)
    server = ServerThread(app)
    server.scheduler = app.state.scheduler
    server.root = server.base_url.removesuffix("/v1")
    return server


def _complete(server, prompt: list[int], max_tokens: int = 8) -> tuple[str, list[float]]:
    body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    body |= {"logprobs": 0, "ignore_eos": True}
    r = httpx.post(server.base_url + "/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["text"], choice["logprobs"]["token_logprobs"]


def _metrics(server) -> dict[str, float]:
    text = httpx.get(server.root + "/metrics", timeout=30).text
    return {m[1]: float(m[2]) for m in re.finditer(r"^dsv32_(prefix_cache_\w+) (\S+)$", text, re.M)}


def _kept_reply(server, prompt: list[int], length: int) -> list[int]:
    """The tokens of the row the reply to ``prompt`` left in the cache (the scheduler keeps it right
    after the reply's last token is sent)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with server.scheduler.model_lock:
            rows = [r.ids for r in server.scheduler.prefix.rows if len(r.ids) == length]
        for ids in rows:
            if ids[: len(prompt)] == prompt:
                return ids[len(prompt) :]
        time.sleep(0.01)
    raise AssertionError("the finished reply was not kept")


def test_a_conversation_decodes_what_an_uncached_server_decodes_and_reports_its_hits(served):
    vocab = served.model.config.vocab_size
    prompts, cached = [FIRST], []
    with _server(served, prefix_cache_bytes=2**30) as server:
        for turn in range(3):  # each prompt: the last one, the reply's tokens, a tool result
            prompt = prompts[-1]
            cached.append(_complete(server, prompt))
            reply = _kept_reply(server, prompt, len(prompt) + 7)  # all but the reply's last token
            prompts.append(prompt + reply + [(11 * turn + j) % (vocab - 3) + 2 for j in range(3)])
        last: list = [None, None]  # two samples of one prompt at once (a group)

        def call(i: int) -> None:
            last[i] = _complete(server, prompts[-1], max_tokens=6)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        cached += last
        metrics = _metrics(server)
    with _server(served, prefix_cache_bytes=0) as plain:
        assert plain.scheduler.prefix is None
        uncached = [_complete(plain, p) for p in prompts[:3]]
        uncached += [_complete(plain, prompts[-1], max_tokens=6)] * 2
    for (text_a, logp_a), (text_b, logp_b) in zip(cached, uncached, strict=True):
        assert text_a == text_b
        assert logp_a == pytest.approx(logp_b, abs=1e-4)
    queries = sum(map(len, prompts[:3])) + 2 * len(prompts[-1])
    assert metrics["prefix_cache_queries_total"] == queries
    # every turn's prompt but its 3 new tokens and the reply's last; one sample of the group all but
    # its last token (the other at least as much as a new turn)
    assert metrics["prefix_cache_hits_total"] >= 2 * (len(prompts[1]) - 4) + len(prompts[-1]) - 1
    assert metrics["prefix_cache_hit_rate"] == pytest.approx(
        metrics["prefix_cache_hits_total"] / queries, rel=1e-6
    )
    assert 0 < metrics["prefix_cache_bytes"] <= 2**30 and metrics["prefix_cache_rows"] >= 1


def test_the_token_route_reuses_the_cache_and_returns_the_same_tokens(served):
    body = {
        "token_ids": [list(range(20, 44)), list(range(20, 44))],
        "sampling_params": {"max_tokens": 6, "temperature": 0, "stop_token_ids": []},
    }

    def generate(server) -> list[list[int]]:
        reply = httpx.post(server.root + "/inference/v1/generate", json=body, timeout=60).json()
        return [c["token_ids"] for c in reply["choices"]]

    with _server(served, prefix_cache_bytes=2**30) as server:
        first = generate(server)
        second = generate(server)  # the kept rows serve all but the last prompt token
        metrics = _metrics(server)
    with _server(served, prefix_cache_bytes=0) as plain:
        expected = generate(plain)
    assert first == second == expected
    assert metrics["prefix_cache_hits_total"] >= 23 + 2 * 23  # the duplicate, then both rows


def test_memory_stays_under_the_bound_with_eviction(served):
    with _server(served, prefix_cache_bytes=2**20) as probe:
        _complete(probe, list(range(10, 40)), max_tokens=1)
        row = _metrics(probe)["prefix_cache_bytes"]  # a 30-token prompt's entries
    bound = int(2.5 * row)
    with _server(served, prefix_cache_bytes=bound) as server:
        prompts = [[100 + i, *range(10, 39)] for i in range(8)]  # nothing shared
        threads = [threading.Thread(target=_complete, args=(server, p, 1)) for p in prompts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        metrics = _metrics(server)
    assert 0 < metrics["prefix_cache_bytes"] <= bound
    assert metrics["prefix_cache_rows"] == 2
    assert metrics["prefix_cache_evictions_total"] == 6


def test_a_weight_update_empties_the_cache(served, tmp_path):
    with _server(served, prefix_cache_bytes=2**30) as server:
        _complete(server, FIRST)
        assert _metrics(server)["prefix_cache_rows"] >= 1
        path = save_weights(served.model, tmp_path / "w.safetensors", 4)
        r = httpx.post(
            server.root + "/update_weights", json={"path": str(path), "weight_version": 4}, timeout=60
        )
        assert r.status_code == 200, r.text
        metrics = _metrics(server)
        assert metrics["prefix_cache_rows"] == 0 and metrics["prefix_cache_bytes"] == 0
        hits = metrics["prefix_cache_hits_total"]
        _complete(server, FIRST)  # computed anew by the new weights
        assert _metrics(server)["prefix_cache_hits_total"] == hits
