"""A client that goes away while its tokens are flowing frees its batch row at once, streamed or not,
and counts under ``status="499"``; a server told to stop ends the requests in flight with a 503."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx2 as httpx
import pytest
from helpers.serve import client_for, wait_for

MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def endless(one_thread, v32_served):
    """The tiny V3.2 model without an end token: a request decodes until its max_tokens."""
    from dsv32.serve import ServerThread, create_app

    v32_served.eos_ids = []
    with ServerThread(create_app(v32_served, max_batch=2)) as server:
        yield server


def _metrics(server) -> dict[str, float]:
    text = httpx.get(server.base_url.removesuffix("/v1") + "/metrics").text
    return {
        line.rsplit(" ", 1)[0].removeprefix("dsv32_"): float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("dsv32_")
    }


def _open_request(server, path: str, body: dict) -> socket.socket:
    """A raw HTTP request whose connection the test can drop whenever it likes."""
    data = json.dumps(body).encode()
    sock = socket.create_connection((server.host, server.port))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {server.host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_disconnect_while_tokens_flow_frees_the_row_at_once(endless, path, stream):
    before = _metrics(endless)
    body = {"model": "tiny-v32", "max_tokens": 900, "stream": stream, "temperature": 1.0}
    if path == "/v1/completions":
        body["prompt"] = "abc"
    else:
        body["messages"] = [{"role": "user", "content": "abc"}]
    print(path, stream)
    sock = _open_request(endless, path, body)
    try:
        # tokens are flowing: the row is in the batch and has decoded a few
        wait_for(
            lambda: _metrics(endless)["generation_tokens_total"] >= before["generation_tokens_total"] + 5
        )
        assert _metrics(endless)["running_rows"] == 1
    finally:
        sock.close()
    seconds = wait_for(lambda: _metrics(endless)["running_rows"] == 0)
    print(f"row freed {seconds:.3f} s after the disconnect")
    after = _metrics(endless)
    # the row left long before its 900 tokens: it was cancelled, not finished
    assert after["generation_tokens_total"] - before["generation_tokens_total"] < 900
    assert seconds < 10
    key = f'requests_total{{endpoint="{path}",status="499"}}'
    wait_for(lambda: _metrics(endless).get(key, 0) == before.get(key, 0) + 1)
    assert not any('status="200"' in k and path in k for k in after if after[k] != before.get(k, 0))


def test_closing_the_server_ends_requests_in_flight_with_503(one_thread):
    import openai

    from dsv32.serve import ServerThread, create_app, load_served

    served = load_served(MODEL, device="cpu")
    served.eos_ids = []
    server = ServerThread(create_app(served))
    outcome = {}

    def ask() -> None:
        try:
            client_for(server).completions.create(model=MODEL, prompt="abc", max_tokens=1000)
        except openai.APIStatusError as err:
            outcome["status"], outcome["body"] = err.status_code, err.body

    with server:
        asking = threading.Thread(target=ask, daemon=True)
        asking.start()
        wait_for(lambda: _metrics(server)["running_rows"] == 1)
        start = time.monotonic()
    asking.join(timeout=30)
    assert time.monotonic() - start < 10
    assert outcome["status"] == 503 and outcome["body"]["code"] == "shutting_down"
