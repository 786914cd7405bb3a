"""A remote engine SIGKILLed under a running ``dsv32 rl train``: the trainer exits with code 2 at once,
its one-line error naming the request that failed; with the engine back, the run resumes from its
last checkpoint to the metrics of a run that was never interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("transformers")

from helpers.remote import running

from dsv32.serve import free_port

STEPS = 4
TIMINGS = ("seconds",)  # besides every key ending in _s


def _engine(port: int):
    """``dsv32 serve tiny-native --enable-rl-routes`` on ``port``: the process and the context that
    waits for it and stops it."""
    cmd = [sys.executable, "-c", "import sys; from dsv32.cli import main; sys.exit(main())", "serve",
           "tiny-native", "--port", str(port), "--device", "cpu", "--threads", "1", "--enable-rl-routes"]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, running(proc, f"http://127.0.0.1:{port}", 120, stop_timeout=30)


def _train(out, url: str) -> subprocess.Popen:
    sets = [f"engine.url={url}", "engine.kind=remote", "grpo.prompts_per_step=2", "grpo.group_size=2",
            "grpo.mini_batches=1", "grpo.micro_batch=4", "sampling.max_new_tokens=6", "eval.problems=0",
            "save_every=1", "seed=3"]  # fmt: skip
    cmd = [sys.executable, "-c", "import sys; from dsv32.cli import main; sys.exit(main())", "rl", "train",
           "--policy", "tiny-native", "--steps", str(STEPS), "--out", str(out), "--no-progress",
           *[a for s in sets for a in ("--set", s)]]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _rows(out) -> list[dict]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _same(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.endswith("_s") and k not in TIMINGS}


def test_an_engine_killed_mid_run_stops_the_trainer_at_once_and_the_run_resumes_to_the_same_metrics(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc, engine = _engine(port)
    with engine:
        straight = _train(tmp_path / "straight", url)
        assert straight.wait(timeout=600) == 0, straight.stderr.read()[-3000:]
    reference = _rows(tmp_path / "straight")
    assert [r["step"] for r in reference] == list(range(1, STEPS + 1))

    proc, engine = _engine(port)
    with engine:
        trainer = _train(tmp_path / "run", url)
        try:
            deadline = time.monotonic() + 300
            while len(_rows(tmp_path / "run")) < 2:  # two steps done
                assert trainer.poll() is None, trainer.stderr.read()[-3000:]
                assert time.monotonic() < deadline, "the run did not reach step 2"
                time.sleep(0.05)
            proc.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            said: list[tuple[float, str]] = []  # (when, line) as the trainer writes them
            reader = threading.Thread(
                target=lambda: said.extend((time.monotonic(), line) for line in trainer.stderr), daemon=True
            )
            reader.start()
            code = trainer.wait(timeout=60)
            exited = time.monotonic()
            reader.join(timeout=10)
        finally:
            if trainer.poll() is None:
                trainer.kill()
                trainer.wait()
    lines = [(t, line.strip()) for t, line in said if line.startswith("dsv32 rl train:")]
    err = "".join(line for _, line in said)
    assert code == 2 and len(lines) == 1, err[-3000:]
    ((noticed, line),) = lines
    assert url in line and any(
        p in line for p in ("/weight_info", "/update_weights", "/inference/v1/generate")
    )
    assert "Traceback" not in err
    print(
        f"engine killed → its failed request reported {noticed - killed:.2f} s later → the trainer exited "
        f"{exited - noticed:.2f} s after that: {line}"
    )
    # the step under way ends (its checkpoint written) and the next request fails at once; then it exits
    assert noticed - killed < 10 and exited - noticed < 2, (noticed - killed, exited - noticed)
    done = len(_rows(tmp_path / "run"))
    assert 2 <= done < STEPS

    proc, engine = _engine(port)  # the engine back (its weights as it starts: the next sync brings ours)
    with engine:
        resumed = _train(tmp_path / "run", url)
        assert resumed.wait(timeout=600) == 0, resumed.stderr.read()[-3000:]
    rows = _rows(tmp_path / "run")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert [_same(r) for r in rows] == [_same(r) for r in reference]
