"""What the remote-engine tests share: ``dsv32 serve`` in a subprocess on a free loopback port."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import torch

from dsv32.serve import free_port, wait_until_up
from dsv32.serve.server import ServerError


@contextlib.contextmanager
def serve_subprocess(model: str, *extra: str, timeout: float = 120.0):
    """Run ``dsv32 serve MODEL --enable-rl-routes`` (a rollout engine: CPU, as many torch threads as
    this process) until the block ends; yields its root URL."""
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-c", "import sys; from dsv32.cli import main; sys.exit(main())", "serve", model,
           "--port", str(port), "--device", "cpu", "--threads", str(torch.get_num_threads()), "--enable-rl-routes",
           *extra]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with running(proc, f"http://127.0.0.1:{port}", timeout, stop_timeout=30) as url:
        yield url


@contextlib.contextmanager
def running(proc: subprocess.Popen, url: str, timeout: float, stop_timeout: float, log=None):
    """``url`` once the server ``proc`` runs answers; terminated (killed if it lingers) when the block
    ends. ``log``: where its output goes (read into the failure when it exits early), else its stdout."""
    try:
        try:
            wait_until_up(url, proc, timeout)
        except ServerError as err:
            output = "" if proc.poll() is None else (log.read_text()[-3000:] if log else proc.stdout.read())
            raise AssertionError(f"{err}\n{output}") from None
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=stop_timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=stop_timeout)
