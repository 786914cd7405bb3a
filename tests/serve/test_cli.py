"""``dsv32 serve DIR`` in a subprocess: a native V3.2 checkpoint with its tokenizer, on a free port."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx2 as httpx
import openai
import pytest
from helpers import v32_model as V
from helpers.serve import client_for

from dsv32.serve import free_port


def test_dsv32_serve_a_native_checkpoint(tmp_path):
    path = V.save_plain(tmp_path / "tiny-v32")
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", "import sys; from dsv32.cli import main; sys.exit(main())", "serve", str(path), "--port", str(port), "--max-batch", "2",
           "--served-model-name", "tiny", "--api-key", "k"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "dsv32 serve did not start"
                time.sleep(0.2)

        class Server:
            base_url = f"http://127.0.0.1:{port}/v1"

        client = client_for(Server, api_key="k")
        assert [m.id for m in client.models.list()] == ["tiny"]
        r = client.chat.completions.create(model="tiny", messages=V.QUESTION, max_tokens=5, temperature=0)
        assert r.choices[0].finish_reason in ("stop", "length") and r.usage.prompt_tokens > 0
        # SIGTERM while a request decodes: the request ends with a 503 and the server exits promptly
        stream = client.completions.create(
            model="tiny", prompt="abc", max_tokens=900, stream=True, extra_body={"ignore_eos": True}
        )
        next(iter(stream))
        proc.terminate()
        start = time.monotonic()
        proc.wait(timeout=30)
        stopped_in = time.monotonic() - start
        with pytest.raises(openai.APIError, match="shutting down"):  # an error event ends the stream
            list(stream)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(f"stopped {stopped_in:.2f} s after SIGTERM")
    assert stopped_in < 10, stopped_in
    assert f"dsv32 serve: tiny (V3.2 format) on http://127.0.0.1:{port}/v1" in proc.stdout.read()


def test_the_start_up_line_says_how_chat_requests_become_prompts(v32_served):
    from dsv32.serve import load_served

    assert v32_served.prompt_format == "V3.2 format"
    assert load_served("tiny-native", device="cpu").prompt_format == "no chat template: text completions only"


def test_waiting_for_a_server_that_exits_or_never_answers_is_a_server_error():
    import subprocess
    import sys

    from dsv32.serve import free_port, wait_until_up
    from dsv32.serve.server import ServerError

    url = f"http://127.0.0.1:{free_port()}"
    gone = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    gone.wait()
    with pytest.raises(ServerError, match="exited with status 3"):
        wait_until_up(url, gone, timeout=5)
    silent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(ServerError, match=r"did not answer within 0\.5 s"):
            wait_until_up(url, silent, timeout=0.5, poll=0.1)
    finally:
        silent.kill()
        silent.wait()
