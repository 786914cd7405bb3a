"""Launching a distributed test's worker processes (:mod:`helpers.worker`) with ``torchrun`` on 127.0.0.1."""

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
    """This process's environment for a launched one: the source and ``tests/`` (the worker imports
    :mod:`helpers`) on ``PYTHONPATH``, offline, one torch thread; ``extra`` added."""
    path = [str(ROOT / "src"), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]
    out = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
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
    """Run ``jobs`` (see :mod:`helpers.worker`) in ``nproc`` processes; fails the test with their output."""
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


def run_ranks_alone(command: list[str], timeout_s: float, nproc: int = 2) -> list[tuple[int, str]]:
    """``dsv32 COMMAND`` in ``nproc`` processes, each as ``torchrun`` starts it (its rank's
    variables, ``DSV32_DIST_TIMEOUT`` = ``timeout_s``) but without the agent, which would stop the
    other ranks as soon as one exits; returns each rank's exit code and its stdout + stderr."""
    port = free_port()
    dsv32 = Path(sys.executable).with_name("dsv32")
    procs = [
        subprocess.Popen(
            [sys.executable, str(dsv32), *command],
            env=env(
                RANK=str(r),
                LOCAL_RANK=str(r),
                WORLD_SIZE=str(nproc),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                DSV32_DIST_TIMEOUT=str(timeout_s),
            ),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(nproc)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=timeout_s + 120)
        results.append((p.returncode, out + err))
    return results


def error_lines(output: str, prefix: str) -> list[str]:
    """The lines of ``output`` that start with ``prefix`` (a command's one-line errors)."""
    return [line for line in output.splitlines() if line.startswith(prefix)]
