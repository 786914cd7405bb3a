"""Model names: an unknown name is refused at once, naming the known ones, without a request to the
hub whether or not ``HF_HUB_OFFLINE`` is set; a directory and a hub id in the local cache load from
disk."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dsv32.engine.models import KNOWN_MODELS, ModelLoadError, load_model, tiny_llama_config


@pytest.fixture
def hub():
    """A stand-in hub on 127.0.0.1 that counts the requests it gets (every answer is a 404)."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self):
            seen.append(self.path)
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD = _answer

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def _dsv32(args, tmp_path, endpoint, offline=None):
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env |= {"HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": os.pathsep.join(sys.path)}
    if offline is not None:
        env["HF_HUB_OFFLINE"] = offline
    code = "import sys; from dsv32.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )


@pytest.mark.parametrize(("offline", "name"), [(None, "someone/no-such-model"), ("0", "no-such-model")])
def test_an_unknown_name_is_refused_at_once_with_the_known_names(tmp_path, hub, offline, name):
    endpoint, seen = hub
    done = _dsv32(["serve", name, "--port", "0"], tmp_path, endpoint, offline)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert f"cannot load model {name!r}" in line
    assert all(known in line for known in KNOWN_MODELS), line
    assert "cached" in line
    assert seen == []  # the hub was never asked (its retries are what made this take a minute)


def test_a_model_directory_loads(tmp_path):
    from transformers import LlamaForCausalLM

    LlamaForCausalLM(tiny_llama_config()).save_pretrained(tmp_path / "m")
    loaded = load_model(str(tmp_path / "m"), device="cpu")
    assert loaded.kind == "hf" and loaded.model.config.hidden_size == 64


def _cache_hub_model(cache: Path, repo: str) -> None:
    """``repo`` laid out as ``huggingface_hub`` keeps a downloaded model (refs/main → a snapshot)."""
    from transformers import LlamaForCausalLM

    folder = cache / f"models--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / ("0" * 40)
    LlamaForCausalLM(tiny_llama_config()).save_pretrained(snapshot)
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("0" * 40)


def test_a_hub_id_in_the_local_cache_loads_and_is_listed_when_a_name_is_unknown(tmp_path, monkeypatch):
    cache = tmp_path / "hf" / "hub"
    _cache_hub_model(cache, "someone/tiny")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    loaded = load_model("someone/tiny", device="cpu")
    assert loaded.kind == "hf" and loaded.model.config.hidden_size == 64
    with pytest.raises(ModelLoadError, match=r"Known names: smollm2, .*cached: someone/tiny"):
        load_model("tiny", device="cpu")
