"""The RL endpoints of ``dsv32 serve``: file weight sync (tied LM head included) that leaves the
server's logits equal to the trainer's, pause modes, token-in/token-out generation, refusals (a bad
weight file never quoted), and the routes that change the server off unless it is started with them."""

from __future__ import annotations

import threading

import httpx2 as httpx
import pytest
import torch

pytest.importorskip("transformers")

from dsv32.engine.weight_files import save_weights
from dsv32.rl.engines import FileWeightSync, RemoteEngine
from dsv32.rl.grpo.policy import load_policy


@pytest.fixture(scope="module")
def served(one_thread):
    from dsv32.serve import load_served

    return load_served("tiny-llama", device="cpu")


@pytest.fixture(scope="module")
def server(served):
    from dsv32.serve import ServerThread, create_app

    app = create_app(served, max_batch=4, rl_routes=True)
    with ServerThread(app) as server:
        server.root = server.base_url.removesuffix("/v1")
        server.scheduler = app.state.scheduler
        yield server


def _trainer_policy(seed: int):
    policy = load_policy("tiny-llama", device="cpu")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return policy


def test_after_a_file_sync_the_servers_logits_equal_the_trainers_tied_head_included(server, served, tmp_path):
    policy = _trainer_policy(seed=0)
    model = served.model
    assert policy.model.config.tie_word_embeddings
    assert not torch.equal(model.lm_head.weight, policy.model.lm_head.weight)
    engine = RemoteEngine(server.base_url, sync=FileWeightSync(tmp_path))
    assert engine.sync(policy.model, 3) > 0
    assert engine.weight_version() == 3
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied
    theirs, ours = model.state_dict(), policy.model.state_dict()
    assert set(theirs) == set(ours) and all(torch.equal(theirs[k], ours[k]) for k in ours)
    ids = torch.tensor([[72, 101, 108, 108, 111, 32, 119]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, policy.model(ids).logits, atol=1e-6, rtol=0)

    # over HTTP: greedy continuation and its log-probs, as the trainer computes them
    body = {
        "token_ids": ids[0].tolist(),
        "sampling_params": {"max_tokens": 5, "temperature": 0, "stop_token_ids": []},
    }
    reply = httpx.post(server.root + "/inference/v1/generate", json=body, timeout=60).json()
    assert reply["weight_version"] == 3
    choice = reply["choices"][0]
    tokens = choice["token_ids"]
    full = torch.tensor([ids[0].tolist() + tokens])
    with torch.no_grad():
        logp = torch.log_softmax(policy.model(full).logits[0, ids.shape[1] - 1 : -1], -1)
    expected = logp.gather(-1, torch.tensor(tokens)[:, None])[:, 0]
    got = torch.tensor([e["logprob"] for e in choice["logprobs"]["content"]])
    assert tokens == logp.argmax(-1).tolist()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_a_weight_file_that_leaves_out_the_tied_head_is_refused_and_changes_nothing(server, served, tmp_path):
    policy = _trainer_policy(seed=1)
    RemoteEngine(server.base_url, sync=FileWeightSync(tmp_path)).sync(policy.model, 4)
    before = {k: v.clone() for k, v in served.model.state_dict().items()}

    class EmbeddingOnly(torch.nn.Module):  # what a sync that pushes embed_tokens alone would write
        def state_dict(self, *a, **k):
            return {k: v for k, v in policy.model.state_dict().items() if k != "lm_head.weight"}

    partial = save_weights(EmbeddingOnly(), tmp_path / "partial.safetensors", 5)
    r = httpx.post(
        server.root + "/update_weights", json={"path": str(partial), "weight_version": 5}, timeout=60
    )
    assert r.status_code == 400 and "lm_head.weight" in r.json()["error"]["message"]
    assert httpx.get(server.root + "/weight_info").json()["weight_version"] == 4
    assert all(torch.equal(v, before[k]) for k, v in served.model.state_dict().items())
    for body, needle in (
        ({"path": str(tmp_path / "missing.safetensors"), "weight_version": 6}, "cannot read"),
        (
            {"path": str(save_weights(policy.model, tmp_path / "v7.safetensors", 7)), "weight_version": 8},
            "version 7",
        ),
    ):
        r = httpx.post(server.root + "/update_weights", json=body, timeout=60)
        assert r.status_code == 400 and needle in r.json()["error"]["message"]


def test_pause_keep_holds_requests_until_resume_and_abort_fails_them(server, served):
    root = server.root
    assert httpx.post(root + "/pause?mode=keep", timeout=60).json() == {
        "paused": True,
        "mode": "keep",
        "aborted": 0,
    }
    assert httpx.get(root + "/is_paused").json()["is_paused"] is True
    replies = {}

    def call(name, path, body):
        replies[name] = httpx.post(root + path, json=body, timeout=120)

    gen = {"token_ids": [104, 105], "sampling_params": {"max_tokens": 3, "temperature": 0}}
    cmpl = {"model": served.name, "prompt": "hi", "max_tokens": 3, "temperature": 0}
    threads = [
        threading.Thread(target=call, args=("generate", "/inference/v1/generate", gen)),
        threading.Thread(target=call, args=("completion", "/v1/completions", cmpl)),
    ]
    for t in threads:
        t.start()
    threads[1].join(0.5)
    assert "completion" not in replies and "generate" not in replies  # held while paused
    # abort fails what is queued (the completion); the RL generate waits for /resume
    for _ in range(600):  # the completion reaches the scheduler's queue
        if server.scheduler.waiting:
            break
        threading.Event().wait(0.05)
    aborted = httpx.post(root + "/pause?mode=abort", timeout=60).json()
    assert aborted == {"paused": True, "mode": "abort", "aborted": 1}
    threads[1].join(60)
    assert replies["completion"].status_code == 500
    assert "aborted" in replies["completion"].json()["error"]["message"]
    assert httpx.post(root + "/resume", timeout=60).json() == {"paused": False}
    threads[0].join(60)
    assert (
        replies["generate"].status_code == 200
        and len(replies["generate"].json()["choices"][0]["token_ids"]) >= 1
    )
    r = httpx.post(root + "/v1/completions", json=cmpl, timeout=60)  # served again after resume
    assert r.status_code == 200


def test_pause_wait_lets_running_requests_finish(server, served):
    root = server.root
    reply = {}
    body = {"model": served.name, "prompt": "hello", "max_tokens": 6, "temperature": 0}
    t = threading.Thread(
        target=lambda: reply.setdefault("r", httpx.post(root + "/v1/completions", json=body, timeout=120))
    )
    t.start()
    paused = httpx.post(root + "/pause?mode=wait", timeout=60).json()
    assert paused["mode"] == "wait" and paused["aborted"] == 0
    httpx.post(root + "/resume", timeout=60)
    t.join(60)
    assert reply["r"].status_code == 200 and reply["r"].json()["choices"][0]["finish_reason"] in (
        "stop",
        "length",
    )


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"token_ids": [1, 999]}, 400, "token ids must be in"),
        ({"token_ids": []}, 400, "no tokens"),
        ({"token_ids": [[1], []]}, 400, "no tokens"),
        ({"token_ids": [1], "stream": True}, 400, "streaming"),
        ({"token_ids": [1], "model": "other"}, 404, "other"),
        ({"token_ids": [1], "sampling_params": {"max_tokens": 5000}}, 400, "positions"),
        ({"token_ids": [1], "sampling_params": {"top_p": 0}}, 400, "top_p"),
        ({"token_ids": [1], "sampling_params": {"seed": 2**70}}, 400, "sampling_params.seed"),
        ({"token_ids": [1], "sampling_params": {"seed": -(2**63) - 1}}, 400, "sampling_params.seed"),
        ({"token_ids": [1], "sampling_params": {"top_k": -5}}, 400, "sampling_params.top_k"),
        ({"token_ids": [1], "sampling_params": {"temperature": 2.5}}, 400, "sampling_params.temperature"),
        ({"token_ids": ["1", "2"]}, 400, "token_ids[0] is '1'"),
        ({"token_ids": [[1], [2.0]]}, 400, "token_ids[1][0] is 2.0"),
        ({"token_ids": [1, True]}, 400, "token_ids[1] is True"),
        ({"token_ids": [1, [2]]}, 400, "token_ids[1] is [2]"),
        ({"token_ids": "12"}, 400, "a list of token ids"),
        ({"token_ids": [1], "sampling_params": {"stop_token_ids": ["2"]}}, 400, "stop_token_ids"),
        ({"token_ids": [1], "sampling_params": {"max_tokens": "4"}}, 400, "max_tokens"),
        ({"token_ids": [[1, 2], [3]], "pad_token_id": 10**9}, 400, "pad_token_id must be in"),
        ({"token_ids": [[1, 2], [3]], "pad_token_id": "0"}, 400, "pad_token_id"),
    ],
)
def test_generate_refuses_bad_requests_with_openai_errors(server, body, status, needle):
    r = httpx.post(server.root + "/inference/v1/generate", json=body, timeout=60)
    error = r.json()["error"]
    assert r.status_code == status and needle in error["message"], error
    assert set(error) == {"message", "type", "param", "code"}
    assert httpx.get(server.root + "/health").status_code == 200


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seed", 2**70),
        ("seed", "7"),
        ("top_k", -5),
        ("temperature", 2.5),
        ("temperature", -0.1),
        ("temperature", True),
        ("top_p", 0),
        ("top_p", 1.5),
        ("max_tokens", 0),
    ],
)
def test_the_rl_route_bounds_sampling_as_the_openai_routes_do_with_the_same_message(
    server, served, field, value
):
    generate = httpx.post(
        server.root + "/inference/v1/generate",
        json={"token_ids": [1], "sampling_params": {field: value}},
        timeout=60,
    )
    completion = httpx.post(
        server.root + "/v1/completions",
        json={"model": served.name, "prompt": [1], field: value},
        timeout=60,
    )
    assert generate.status_code == completion.status_code == 400
    rl, openai = generate.json()["error"]["message"], completion.json()["error"]["message"]
    assert rl == openai.replace(f"request: {field}:", f"request: sampling_params.{field}:"), (rl, openai)


@pytest.mark.parametrize("top_k", [-1, 0, 3])
def test_top_k_minus_one_and_zero_are_off_on_the_rl_route(server, top_k):
    body = {
        "token_ids": [104, 105],
        "sampling_params": {"max_tokens": 3, "top_k": top_k, "seed": 5, "return_sampling_mask": True},
    }
    r = httpx.post(server.root + "/inference/v1/generate", json=body, timeout=60)
    assert r.status_code == 200
    mask = r.json()["choices"][0]["sampling_mask"]
    assert (mask is None) == (top_k <= 0)


def test_a_ragged_batch_without_pad_token_id_is_padded_with_the_id_the_reply_states(server, served):
    prompts = [[104, 105, 106], [120]]
    params = {"max_tokens": 4, "temperature": 1.0, "seed": 3}
    r = httpx.post(
        server.root + "/inference/v1/generate",
        json={"token_ids": prompts, "sampling_params": params},
        timeout=60,
    ).json()
    assert r["pad_token_id"] == served.eos_ids[0]  # tiny-llama has no pad id: the first stop id
    explicit = httpx.post(
        server.root + "/inference/v1/generate",
        json={"token_ids": prompts, "sampling_params": params, "pad_token_id": r["pad_token_id"]},
        timeout=60,
    ).json()
    assert [c["token_ids"] for c in r["choices"]] == [c["token_ids"] for c in explicit["choices"]]
    # the padding is masked out: another pad id samples the same tokens with the same log-probs
    other = httpx.post(
        server.root + "/inference/v1/generate",
        json={"token_ids": prompts, "sampling_params": params, "pad_token_id": 0},
        timeout=60,
    ).json()
    assert other["pad_token_id"] == 0
    assert [c["token_ids"] for c in other["choices"]] == [c["token_ids"] for c in r["choices"]]
    assert [c["logprobs"] for c in other["choices"]] == [c["logprobs"] for c in r["choices"]]
    no_stops = params | {"stop_token_ids": []}
    r = httpx.post(
        server.root + "/inference/v1/generate",
        json={"token_ids": prompts, "sampling_params": no_stops},
        timeout=60,
    ).json()
    assert r["pad_token_id"] == 0
    one = httpx.post(
        server.root + "/inference/v1/generate", json={"token_ids": prompts[0]}, timeout=60
    ).json()
    assert "pad_token_id" not in one  # one prompt: nothing is padded


def test_a_batched_generate_is_seeded_and_returns_kept_sets(server):
    body = {
        "token_ids": [[104, 105], [120]],
        "pad_token_id": 0,
        "sampling_params": {
            "max_tokens": 4,
            "temperature": 1.0,
            "top_p": 0.5,
            "seed": 11,
            "return_sampling_mask": True,
        },
    }
    a = httpx.post(server.root + "/inference/v1/generate", json=body, timeout=60).json()
    b = httpx.post(server.root + "/inference/v1/generate", json=body, timeout=60).json()
    assert [c["token_ids"] for c in a["choices"]] == [c["token_ids"] for c in b["choices"]]
    for c in a["choices"]:
        assert len(c["sampling_mask"]) == len(c["token_ids"])
        assert all(t in kept for t, kept in zip(c["token_ids"], c["sampling_mask"]))
        assert c["routed_experts"] is None  # a dense model has no routing


def test_without_the_flag_the_control_routes_are_404_and_change_nothing(served, tmp_path):
    from dsv32.serve import ServerThread, create_app
    from dsv32.serve.rl_routes import CONTROL_ROUTES

    before = {k: v.clone() for k, v in served.model.state_dict().items()}
    weights = save_weights(_trainer_policy(seed=2).model, tmp_path / "v9.safetensors", 9)
    bodies = {
        "/update_weights": {"path": str(weights), "weight_version": 9},
        "/init_weight_transfer_engine": {"master_address": "127.0.0.1", "master_port": 1},
    }
    with ServerThread(create_app(served, max_batch=2)) as plain:
        root = plain.base_url.removesuffix("/v1")
        version = httpx.get(root + "/weight_info").json()["weight_version"]
        for method, path in CONTROL_ROUTES:
            r = httpx.request(method, root + path + "?mode=keep", json=bodies.get(path), timeout=60)
            assert r.status_code == 404, (path, r.text)
            error = r.json()["error"]
            assert error["code"] == "rl_routes_disabled" and "--enable-rl-routes" in error["message"]
        assert httpx.get(root + "/is_paused").json()["is_paused"] is False
        assert httpx.get(root + "/weight_info").json()["weight_version"] == version
        body = {"token_ids": [104, 105], "sampling_params": {"max_tokens": 2, "temperature": 0}}
        reply = httpx.post(root + "/inference/v1/generate", json=body, timeout=60)  # read-only: served
        assert reply.status_code == 200 and len(reply.json()["choices"][0]["token_ids"]) == 2
    assert all(torch.equal(v, before[k]) for k, v in served.model.state_dict().items())


SECRET = "s3cr3t-ssh-key-material"


def _bad_weight_files(tmp_path, policy) -> list:
    """Files that are not weight files for the served model, each holding SECRET somewhere: text,
    a safetensors header cut short, a dtype that is not one, a version that is not a number, keys the
    model does not have."""
    import json
    import struct

    def raw(name: str, header: dict | str, data: bytes = b"") -> str:
        text = header if isinstance(header, str) else json.dumps(header)
        path = tmp_path / name
        path.write_bytes(struct.pack("<Q", len(text.encode())) + text.encode() + data)
        return str(path)

    (tmp_path / "text").write_text(SECRET * 20)
    own = {k: v.clone() for k, v in policy.model.state_dict().items()}
    own[SECRET] = torch.zeros(1)
    from safetensors.torch import save_file

    save_file(own, str(tmp_path / "extra.safetensors"), metadata={"dsv32_weight_version": "3"})
    tensor = {"dtype": SECRET, "shape": [1], "data_offsets": [0, 4]}
    return [
        str(tmp_path / "text"),
        raw("cut", '{"' + SECRET),
        raw("dtype", {"x": tensor, "__metadata__": {"dsv32_weight_version": "3"}}, b"\0" * 4),
        raw("version", {"__metadata__": {"dsv32_weight_version": SECRET}}),
        str(tmp_path / "extra.safetensors"),
    ]


def test_a_bad_weight_file_is_a_400_that_never_echoes_its_bytes_and_changes_nothing(server, served, tmp_path):
    policy = _trainer_policy(seed=3)
    RemoteEngine(server.base_url, sync=FileWeightSync(tmp_path / "sync")).sync(policy.model, 6)
    before = {k: v.clone() for k, v in served.model.state_dict().items()}
    for path in _bad_weight_files(tmp_path, policy):
        r = httpx.post(server.root + "/update_weights", json={"path": path, "weight_version": 3}, timeout=60)
        assert r.status_code == 400, (path, r.text)
        message = r.json()["error"]["message"]
        assert path in message and SECRET not in r.text, message
    assert httpx.get(server.root + "/weight_info").json()["weight_version"] == 6
    assert httpx.get(server.root + "/is_paused").json()["is_paused"] is False
    assert all(torch.equal(v, before[k]) for k, v in served.model.state_dict().items())


def test_serving_beyond_loopback_without_an_api_key_is_warned_of():
    from dsv32.serve.server import exposure_warning, is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("no-such-host.invalid")
    assert exposure_warning("127.0.0.1", None, rl_routes=True) is None
    assert exposure_warning("0.0.0.0", "key", rl_routes=True) is None
    plain, rl = exposure_warning("0.0.0.0", None, rl_routes=False), exposure_warning("0.0.0.0", None, True)
    assert "--api-key" in plain and "generate" in plain
    assert "--api-key" in rl and "load any weight file" in rl


def test_ignore_eos_decodes_to_max_tokens_past_the_stop_tokens(server):
    prompt = [72, 101, 108, 108, 111]
    params = {"max_tokens": 5, "temperature": 0, "stop_token_ids": []}

    def generate(**extra) -> dict:
        body = {"token_ids": prompt, "sampling_params": params | extra}
        reply = httpx.post(server.root + "/inference/v1/generate", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        return reply.json()["choices"][0]

    free = generate()["token_ids"]
    stop = free[1]
    stopped = generate(stop_token_ids=[stop])
    assert stopped["token_ids"] == free[: free.index(stop) + 1] and stopped["finish_reason"] == "stop"
    ignored = generate(stop_token_ids=[stop], ignore_eos=True)
    assert ignored["token_ids"] == free and ignored["finish_reason"] == "length"
    assert generate(ignore_eos=True)["token_ids"] == free  # the model's own end tokens too
    bad = httpx.post(
        server.root + "/inference/v1/generate",
        json={"token_ids": prompt, "sampling_params": {"ignore_eos": "yes"}},
        timeout=60,
    )
    assert bad.status_code == 400 and "ignore_eos" in bad.text
