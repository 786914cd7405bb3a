"""What the remote-engine tests share: ``dsv32 serve`` in a subprocess on a free loopback port."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.request

import torch

from dsv32.serve import free_port


@contextlib.contextmanager
def serve_subprocess(model: str, *extra: str, timeout: float = 120.0):
    """Run ``dsv32 serve MODEL`` (CPU, as many torch threads as this process) until the block ends;
    yields its root URL."""
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-c", "import sys; from dsv32.cli import main; sys.exit(main())", "serve", model,
           "--port", str(port), "--device", "cpu", "--threads", str(torch.get_num_threads()), *extra]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                assert time.monotonic() < deadline, "dsv32 serve did not start"
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
