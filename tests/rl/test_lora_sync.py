"""A LoRA policy's weight sync sends the adapter alone: ``dsv32 serve`` merges it into its base weights
(``/update_adapter``) and then samples with the log-probs of the in-process merged model, under the
version rules of a weight file, refusing a malformed adapter with a typed 400 and changing nothing;
to vLLM it goes by ``/v1/load_lora_adapter`` (checked against a fake server on 127.0.0.1), and the
route each recipe takes is explicit."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import httpx2 as httpx
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from dsv32.engine import lora
from dsv32.rl.engines import EngineError, FileWeightSync, InProcessEngine, RemoteEngine
from dsv32.rl.engines.weight_sync import VLLM_LORA_NAME, CollectiveWeightSync, lora_route
from dsv32.rl.grpo.config import EngineConfig, RLConfigError
from dsv32.rl.grpo.policy import load_policy

PROMPTS = [[5, 17, 33, 81, 120], [9, 44, 150]]
GEN = dict(max_new_tokens=8, temperature=1.0, top_p=0.9, top_k=0, eos=[2], pad=0, turn=0)
GEN |= dict(return_kept=False, return_routing=False)


@pytest.fixture(scope="module")
def server(one_thread):
    from dsv32.serve import ServerThread, create_app, load_served

    served = load_served("tiny-llama", device="cpu")
    app = create_app(served, max_batch=4, rl_routes=True)
    with ServerThread(app) as s:
        s.root, s.model = s.base_url.removesuffix("/v1"), served.model
        yield s


def lora_policy(seed: int, r: int = 4):
    """tiny-llama with a LoRA adapter whose ``lora_B`` is drawn non-zero (a trained adapter)."""
    policy = load_policy("tiny-llama", device="cpu")
    lora.apply_lora(policy.model, lora.LoRAConfig(enabled=True, r=r, alpha=2.0 * r), seed=seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            if "lora_B" in n:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return policy.model


def sample(engine, seed: int = 7):
    return engine.generate(PROMPTS, generator=torch.Generator().manual_seed(seed), **GEN)


def served_state(server) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in server.model.state_dict().items()}


def test_an_adapter_sync_sends_the_adapter_alone_and_samples_as_the_merged_model(server, tmp_path):
    base = served_state(server)
    for version, seed in ((3, 0), (4, 1)):  # a second adapter replaces the first, it does not add to it
        model = lora_policy(seed)
        engine = RemoteEngine(server.base_url, sync=FileWeightSync(tmp_path))
        assert engine.lora_route == "adapter"
        engine.sync(model, version)
        info = httpx.get(server.root + "/weight_info").json()
        assert (info["weight_version"], info["adapter"]) == (version, True)
        written = sorted(p.name for p in tmp_path.iterdir())
        assert written == [f"adapter-v{version:06d}"]  # the adapter, no weight file; older ones pruned
        sent = lora.read_adapter(tmp_path / written[0])
        assert sent.version == version and all(".lora_" not in n for n in sent.pairs)
        merged = lora.merged_copy(model)
        remote, local = sample(engine), sample(InProcessEngine(merged))
        assert remote.tokens == local.tokens and remote.weight_version == version
        for a, b in zip(remote.logprobs, local.logprobs):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=2e-5, rtol=0)
        ids = torch.tensor([PROMPTS[0]])
        with torch.no_grad():
            torch.testing.assert_close(server.model(ids).logits, model(ids).logits, atol=2e-5, rtol=0)
    # the layers no adapter touches kept the base weights; a full sync afterwards is the new base
    after = served_state(server)
    untouched = [k for k in base if "proj" not in k]
    assert untouched and all(torch.equal(after[k], base[k]) for k in untouched)
    full = load_policy("tiny-llama", device="cpu").model
    RemoteEngine(server.base_url, sync=FileWeightSync(tmp_path / "full")).sync(full, 5)
    assert httpx.get(server.root + "/weight_info").json()["adapter"] is False
    assert all(torch.equal(v, base[k]) for k, v in server.model.state_dict().items())


def _post(server, path, body):
    return httpx.post(server.root + path, json=body, timeout=30)


def test_adapter_versions_follow_the_rules_of_weight_files(server, tmp_path):
    model = lora_policy(2)
    folder = lora.save_adapter(model, tmp_path / "a", version=6)
    before = served_state(server)
    wrong = _post(server, "/update_adapter", {"path": str(folder), "weight_version": 7})
    assert wrong.status_code == 400 and "holds weight version 6" in wrong.json()["error"]["message"]
    unstamped = lora.save_adapter(model, tmp_path / "b")
    assert _post(server, "/update_adapter", {"path": str(unstamped), "weight_version": 6}).status_code == 400
    assert all(torch.equal(v, before[k]) for k, v in server.model.state_dict().items())
    ok = _post(server, "/update_adapter", {"path": str(folder), "weight_version": 6})
    assert ok.status_code == 200 and ok.json()["weight_version"] == 6
    # the trainer's side: an engine reporting another version after the push is an error
    engine = RemoteEngine(server.base_url, sync=FileWeightSync(tmp_path / "c"))
    engine.weight_version = lambda: 99
    with pytest.raises(EngineError, match="pushed version 8, the engine reports 99"):
        engine.sync(model, 8)


def _break(folder: Path, how: str) -> None:
    from safetensors.torch import load_file, save_file

    weights = folder / lora.ADAPTER_FILE
    if how == "config":
        (folder / lora.CONFIG_FILE).write_text("{not json")
    elif how == "dora":
        cfg = json.loads((folder / lora.CONFIG_FILE).read_text())
        (folder / lora.CONFIG_FILE).write_text(json.dumps(cfg | {"use_dora": True}))
    elif how == "bytes":
        weights.write_bytes(b"\x00" * 64)
    else:
        tensors = load_file(str(weights))
        key = next(k for k in tensors if "lora_A" in k)
        if how == "shape":
            tensors[key] = torch.zeros(tensors[key].shape[0], 3)
        elif how == "unpaired":
            del tensors[key]
        elif how == "name":
            module = key.split(".lora_A")[0]
            for part in ("lora_A", "lora_B"):
                tensors[f"{module}_nope.{part}.weight"] = tensors.pop(f"{module}.{part}.weight")
        save_file(tensors, str(weights), metadata={"format": "pt", lora.VERSION_KEY: "9"})


@pytest.mark.parametrize(
    "how,needle",
    [("config", "JSON"), ("dora", "use_dora"), ("bytes", "safetensors"), ("shape", "does not fit"),
     ("unpaired", "lora_A [r, in]"), ("name", "not a linear layer"), ("missing", "not an adapter directory")],
)  # fmt: skip
def test_a_malformed_adapter_is_a_typed_400_and_changes_nothing(server, tmp_path, how, needle):
    folder = lora.save_adapter(lora_policy(3), tmp_path / "a", version=9)
    if how == "missing":
        folder = tmp_path / "nowhere"
    else:
        _break(folder, how)
    before = served_state(server)
    version = httpx.get(server.root + "/weight_info").json()["weight_version"]
    reply = _post(server, "/update_adapter", {"path": str(folder), "weight_version": 9})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (
        error["type"] == "invalid_request_error" and error["param"] == "path" and needle in error["message"]
    )
    assert httpx.get(server.root + "/weight_info").json()["weight_version"] == version
    assert all(torch.equal(v, before[k]) for k, v in server.model.state_dict().items())


@pytest.mark.parametrize("body", [{"path": "x"}, {"weight_version": 1}, {"path": "", "weight_version": 1},
                                  {"path": "x", "weight_version": -1}, {"path": "x", "weight_version": 1, "extra": 1}])  # fmt: skip
def test_a_malformed_adapter_request_is_a_400(server, body):
    reply = _post(server, "/update_adapter", body)
    assert reply.status_code == 400 and reply.json()["error"]["type"] == "invalid_request_error"


def test_the_adapter_route_is_off_without_the_rl_routes(one_thread):
    from dsv32.serve import ServerThread, create_app, load_served

    app = create_app(load_served("tiny-llama", device="cpu"), max_batch=1)
    with ServerThread(app) as s:
        reply = httpx.post(
            s.base_url.removesuffix("/v1") + "/update_adapter", json={"path": "x", "weight_version": 1}
        )
    assert reply.status_code == 404 and "--enable-rl-routes" in reply.text


# ------------------------------------------------------------------ vLLM, against a fake server
class FakeVLLM:
    """What a vLLM server started with ``--enable-lora`` answers (plain text on its LoRA routes);
    keeps every request. ``lora``: False answers ``/v1/load_lora_adapter`` with a 404."""

    def __init__(self, lora: bool = True) -> None:
        self.seen: list[tuple[str, dict | None]] = []
        self.version = None
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _handle(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw) if raw else None
                fake.seen.append((self.path, body))
                status, reply = 200, {}
                if self.path == "/v1/load_lora_adapter":
                    status, reply = (
                        (200, "Success: LoRA adapter loaded") if lora else (404, '{"detail":"Not Found"}')
                    )
                elif self.path == "/update_weight_version":
                    fake.version = body["new_version"]
                elif self.path == "/weight_info":
                    reply = {"weight_version": fake.version}
                elif self.path == "/v1/models":
                    reply = {"object": "list", "data": [{"id": "base", "object": "model"}]}
                elif self.path == "/inference/v1/generate":
                    content = [{"token_id": 4, "logprob": -0.5}]
                    reply = {"choices": [{"index": 0, "token_ids": [4], "logprobs": {"content": content},
                                          "finish_reason": "length"}], "weight_version": fake.version}  # fmt: skip
                data = (reply if isinstance(reply, str) else json.dumps(reply)).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _handle

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeVLLM:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_to_vllm_the_adapter_goes_by_its_lora_loading_route_and_is_sampled_by_name(tmp_path):
    from peft import PeftModel

    model = lora_policy(4)
    with FakeVLLM() as fake:
        engine = RemoteEngine(fake.url, api="vllm", sync=FileWeightSync(tmp_path))
        engine.sync(model, 5)
        out = engine.generate([[5, 6]], generator=torch.Generator().manual_seed(0), **GEN)
    paths = [p for p, _ in fake.seen]
    assert paths[:4] == ["/pause?mode=wait", "/v1/load_lora_adapter", "/update_weight_version", "/resume"]
    load = fake.seen[1][1]
    assert load["lora_name"] == VLLM_LORA_NAME and load["load_inplace"] is True
    assert fake.seen[2][1] == {"new_version": "5"} and out.weight_version == 5
    generate = next(b for p, b in fake.seen if p == "/inference/v1/generate")
    assert generate["model"] == VLLM_LORA_NAME  # sampled with the adapter, not the base model
    # what vLLM reads is an adapter peft itself loads, with the trainer's logits
    fresh = load_policy("tiny-llama", device="cpu").model
    peft_model = PeftModel.from_pretrained(fresh, load["lora_path"])
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        torch.testing.assert_close(peft_model(ids).logits, model(ids).logits, atol=1e-6, rtol=0)


def test_a_vllm_without_runtime_lora_loading_says_how_to_start_it_or_sync_merged(tmp_path):
    model = lora_policy(5)
    with FakeVLLM(lora=False) as fake:
        engine = RemoteEngine(fake.url, api="vllm", sync=FileWeightSync(tmp_path))
        with pytest.raises(EngineError, match=r"--enable-lora.*lora_sync = 'merged'"):
            engine.sync(model, 1)
        assert fake.seen[-1][0] == "/resume"  # generation resumed all the same
        merged = RemoteEngine(fake.url, api="vllm", sync=FileWeightSync(tmp_path / "m"), lora_sync="merged")
        assert merged.lora_route == "merged"
        start = len(fake.seen)
        merged.sync(model, 1)
        paths = [p for p, _ in fake.seen[start:]]
        assert "/collective_rpc" in paths and "/v1/load_lora_adapter" not in paths  # the full weights
        folder = Path(
            next(b for p, b in fake.seen[start:] if p == "/collective_rpc")["kwargs"]["weights_path"]
        )
        assert not any(".lora_" in k for k in _keys(folder / "model.safetensors"))


def _keys(path: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return list(f.keys())


def test_the_route_is_explicit_and_checked():
    assert lora_route("auto", FileWeightSync("/tmp/x")) == "adapter"
    assert lora_route("auto", CollectiveWeightSync()) == "merged"
    assert lora_route("merged", FileWeightSync("/tmp/x")) == "merged"
    with pytest.raises(EngineError, match="sync = 'file'"):
        lora_route("adapter", CollectiveWeightSync())
    with pytest.raises(EngineError, match="unknown lora_sync"):
        RemoteEngine("http://127.0.0.1:1", sync=FileWeightSync("/tmp/x"), lora_sync="delta")
    with pytest.raises(RLConfigError, match="needs sync"):
        EngineConfig(kind="remote", url="http://x", sync="collective", lora_sync="adapter")
    with pytest.raises(RLConfigError):
        EngineConfig(lora_sync="delta")
