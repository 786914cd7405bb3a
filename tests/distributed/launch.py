"""Launching a test's worker processes with ``torchrun`` on 127.0.0.1."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("worker.py")
TORCHRUN = Path(sys.executable).with_name("torchrun")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(**extra: str) -> dict[str, str]:
    out = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    out.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", **extra)
    return out


def torchrun_args(nproc: int, *rest: str) -> list[str]:
    return [
        str(TORCHRUN), "--nnodes", "1", "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
        "--master-port", str(free_port()), "--max-restarts", "0", *rest,
    ]  # fmt: skip


def run_jobs(
    jobs: list[dict], spec: Path, nproc: int = 2, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Run ``jobs`` (see worker.py) in ``nproc`` processes; fails the test with their output."""
    spec.write_text(json.dumps(jobs))
    proc = subprocess.run(
        torchrun_args(nproc, str(WORKER), str(spec)),
        env=env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc
