"""A remote engine's transient failures: with ``[engine] retries`` a request that could not reach the
engine or got a 5xx is sent again after a doubling backoff, and each retry is counted in the step's
``engine_retries``; a 4xx, a time-out and a version mismatch are never sent twice, and without
retries (the default) the first failure is the error."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
import time
import urllib.request

import pytest
import torch

pytest.importorskip("transformers")

from helpers.rl import LETTER_TASKS, LetterReward, jsonl_recipe

from dsv32.rl.engines import EngineClient, EngineError, FileWeightSync, InProcessEngine, RemoteEngine
from dsv32.serve import free_port


class FaultyProxy:
    """A reverse proxy on 127.0.0.1 in front of ``upstream`` (None: answers ``{}`` itself) that
    fails the requests whose path contains ``where`` as ``faults`` says, one fault per request in
    order: ``"503"``/``"502"``/``"400"`` (that status), ``"drop"`` (the connection closed without a
    reply), ``"slow"`` (no reply for 3 s); after them every request goes through."""

    def __init__(self, upstream: str | None, faults: list[str], where: str = "") -> None:
        self.upstream, self.faults, self.where = upstream, list(faults), where
        self.seen: list[str] = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _handle(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                proxy.seen.append(self.path)
                fault = proxy.faults.pop(0) if proxy.faults and proxy.where in self.path else None
                if fault == "drop":
                    self.close_connection = True
                    self.connection.close()
                    return
                if fault == "slow":
                    time.sleep(3)
                if fault in ("400", "502", "503"):
                    self._reply(int(fault), json.dumps({"error": {"message": f"injected {fault}"}}).encode())
                    return
                if proxy.upstream is None:
                    self._reply(200, b"{}")
                    return
                req = urllib.request.Request(
                    proxy.upstream + self.path, data=body or None, method=self.command,
                    headers={"Content-Type": "application/json"},
                )  # fmt: skip
                try:
                    with urllib.request.urlopen(req, timeout=120) as resp:
                        self._reply(resp.status, resp.read())
                except urllib.error.HTTPError as err:
                    self._reply(err.code, err.read())

            def _reply(self, status: int, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a client that gave up
                    self.wfile.write(data)

            do_GET = do_POST = _handle

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FaultyProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("fault", ["503", "502", "drop"])
def test_a_transient_failure_is_sent_again_and_counted(fault):
    with FaultyProxy(None, [fault, fault]) as proxy:
        client = EngineClient(proxy.url, retries=2, backoff=0.05)
        t = time.monotonic()
        assert client.request("POST", "/resume") == {}
        assert time.monotonic() - t >= 0.05 + 0.1  # the backoff doubles
        assert client.retried == 2 and proxy.seen == ["/resume"] * 3


def test_without_retries_the_first_failure_is_the_error_naming_the_request():
    with FaultyProxy(None, ["503"]) as proxy:
        client = EngineClient(proxy.url)
        with pytest.raises(EngineError, match=rf"POST {proxy.url}/resume: HTTP 503: .*injected 503"):
            client.request("POST", "/resume")
        assert client.retried == 0 and proxy.seen == ["/resume"]
    refused = EngineClient(f"http://127.0.0.1:{free_port()}", retries=2, backoff=0.01)
    with pytest.raises(EngineError, match=r"GET http://127\.0\.0\.1:\d+/weight_info: .*refused"):
        refused.request("GET", "/weight_info")
    assert refused.retried == 2  # nobody listening: tried three times, then the error


def test_a_4xx_a_timeout_and_a_collective_announce_are_never_sent_twice():
    with FaultyProxy(None, ["400"]) as proxy:
        client = EngineClient(proxy.url, retries=3, backoff=0.01)
        with pytest.raises(EngineError, match="HTTP 400"):
            client.request("POST", "/update_weights", {"path": "x", "weight_version": 1})
        assert client.retried == 0 and len(proxy.seen) == 1
    with FaultyProxy(None, ["slow"]) as proxy:
        client = EngineClient(proxy.url, retries=3, backoff=0.01, timeout=0.5)
        with pytest.raises(EngineError, match="timed out"):
            client.request("POST", "/inference/v1/generate", {})
        assert client.retried == 0 and len(proxy.seen) == 1
    with FaultyProxy(None, ["503"]) as proxy:
        client = EngineClient(proxy.url, retries=3, backoff=0.01)
        with pytest.raises(EngineError, match="HTTP 503"):
            client.request("POST", "/update_weights", {"weight_version": 1}, retry=False)
        assert client.retried == 0 and len(proxy.seen) == 1


def test_a_version_mismatch_is_not_retried(tmp_path):
    """The engine answers the update with another version: an error of the sync, sent once."""

    with FaultyProxy(None, []) as proxy:  # answers {} to everything: no weight_version in the reply
        engine = RemoteEngine(proxy.url, sync=FileWeightSync(tmp_path), retries=3, backoff=0.01)
        with pytest.raises(EngineError, match="pushed version 1"):
            engine.sync(torch.nn.Linear(2, 2), 1)
        assert engine.retried == 0 and proxy.seen.count("/update_weights") == 1


def test_retries_are_checked_and_declared_by_every_engine():
    from dsv32.rl.grpo.config import RLConfigError, load_rl_config

    with pytest.raises(RLConfigError, match="retries"):
        load_rl_config(None, ["engine.retries=-1"])
    cfg = load_rl_config(None, []).engine
    assert (cfg.retries, cfg.retry_backoff) == (0, 1.0)  # opt-in
    with pytest.raises(EngineError, match="retries"):
        EngineClient("http://127.0.0.1:1", retries=-1)
    assert InProcessEngine(torch.nn.Linear(1, 1)).retried == 0
    assert RemoteEngine("http://127.0.0.1:1").retried == 0


@pytest.fixture(scope="module")
def engine_server(one_thread):
    """``tiny-llama`` served on a thread of this process with the RL routes (file syncs share its disk)."""
    from dsv32.serve import ServerThread, create_app, load_served

    with ServerThread(create_app(load_served("tiny-llama", device="cpu"), rl_routes=True)) as server:
        yield server.base_url.removesuffix("/v1")


def _recipe(tmp_path, url: str, **over):
    sets = ["policy.name=tiny-llama", "grpo.keep_routing=false", "grpo.prompts_per_step=2", "grpo.group_size=2", "grpo.mini_batches=1",
            "grpo.micro_batch=4", "grpo.steps=2", "sampling.max_new_tokens=4", "sampling.temperature=1.0",
            "eval.problems=0", "engine.kind=remote", f"engine.url={url}", "engine.retry_backoff=0.01"]  # fmt: skip
    rows = [{"prompt": t.prompt, "domain": "toy"} for t in LETTER_TASKS]
    return jsonl_recipe(tmp_path, rows, [*sets, *[f"{k}={v}" for k, v in over.items()]])


def test_the_trainer_records_each_steps_retries_and_samples_as_without_faults(engine_server, tmp_path):
    from dsv32.rl.grpo.single_turn import train_grpo

    clean = train_grpo(_recipe(tmp_path / "clean", engine_server), reward_fn=LetterReward(), progress=False)
    faults = ["503", "drop", "502"]  # the first three generate requests (step 1: two groups)
    with FaultyProxy(engine_server, faults, where="/inference/v1/generate") as proxy:
        cfg = _recipe(tmp_path / "faulty", proxy.url, **{"engine.retries": 3})
        faulty = train_grpo(cfg, reward_fn=LetterReward(), progress=False)
    assert [r["engine_retries"] for r in clean.metrics] == [0, 0]
    assert sum(r["engine_retries"] for r in faulty.metrics) == 3
    assert faulty.metrics[0]["engine_retries"] >= 2
    for a, b in zip(clean.metrics, faulty.metrics):  # the retries changed no sample and no update
        same = {k: v for k, v in a.items() if not k.endswith("_s") and k not in ("seconds", "engine_retries")}
        assert same == {k: b[k] for k in same}
    with (
        FaultyProxy(engine_server, ["503"], where="/inference/v1/generate") as proxy,
        pytest.raises(EngineError, match="inference/v1/generate: HTTP 503"),  # retries = 0
    ):
        train_grpo(_recipe(tmp_path / "none", proxy.url), reward_fn=LetterReward(), progress=False)
