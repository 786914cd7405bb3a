"""What a distributed run does when something is wrong: a rank that dies ends the job with a non-zero
exit within the process-group timeout (no hang), and the checkpoint it leaves resumes in one process
to the steps of a run that was never interrupted; a recipe whose step does not split over the ranks
fails on every rank with the command's one-line error, before anything is loaded or written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from helpers.launch import WORKER, env, error_lines, run_ranks_alone, torchrun_args

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(sys.platform != "linux", reason="finds the ranks through /proc"),
]

TIMEOUT_S = 30  # DSV32_DIST_TIMEOUT for these runs


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _rank_of(pid: int) -> int | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in environ:
        if item.startswith(b"RANK="):
            return int(item[5:])
    return None


def test_a_rank_killed_mid_run_ends_the_job_non_zero_within_the_timeout(tmp_path):
    out = tmp_path / "run"
    job = {
        "kind": "stage", "model": "tiny-llama", "out": str(out), "resume": False,
        "cfg": {"stage": "warmup", "steps": 10_000, "batch_size": 2, "lr": 1e-3, "save_every": 1},
    }  # fmt: skip
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps([job]))
    log = (tmp_path / "stderr.log").open("w")  # a file, not a pipe nobody reads while it runs
    proc = subprocess.Popen(
        torchrun_args(2, str(WORKER), str(spec)),
        env=env(DSV32_DIST_TIMEOUT=str(TIMEOUT_S)),
        stdout=subprocess.DEVNULL,
        stderr=log,
        start_new_session=True,  # its own process group: torchrun and the ranks it starts
    )
    try:
        deadline = time.monotonic() + 300
        # training is under way: a checkpoint (each replaces the one before, so look for any step)
        while not any((out / "checkpoints").glob("step_*")):
            assert proc.poll() is None, (tmp_path / "stderr.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the run did not reach step 1"
            time.sleep(0.2)
        victim = next(p for p in _children(proc.pid) if _rank_of(p) == 1)
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)  # rank 1: a child of this test's torchrun
        code = proc.wait(timeout=TIMEOUT_S + 60)
        assert code != 0
        assert time.monotonic() - killed < TIMEOUT_S + 60
    finally:
        if proc.poll() is None:  # a failed test leaves no rank running
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def _checkpoint_steps(out: Path) -> list[int]:
    return sorted(int(p.name.split("_")[1]) for p in (out / "checkpoints").glob("step_*") if p.is_dir())


def test_a_rank_killed_after_two_warmup_steps_exits_1_and_its_checkpoint_resumes_in_one_process(tmp_path):
    from helpers import worker
    from helpers.tolerances import PROCESSES

    out = tmp_path / "run"
    cfg = {"stage": "warmup", "steps": 10_000, "batch_size": 2, "grad_accum": 2, "lr": 1e-2, "save_every": 1}
    job = {
        "kind": "stage",
        "model": "tiny-llama",
        "dtype": "float64",
        "out": str(out),
        "resume": False,
        "cfg": cfg,
    }
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps([job]))
    log = (tmp_path / "stderr.log").open("w")
    proc = subprocess.Popen(
        torchrun_args(2, str(WORKER), str(spec)),
        env=env(DSV32_DIST_TIMEOUT=str(TIMEOUT_S)),
        stdout=subprocess.DEVNULL,
        stderr=log,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 600
        while not any(s >= 2 for s in _checkpoint_steps(out)):  # two warm-up steps, checkpointed
            assert proc.poll() is None, (tmp_path / "stderr.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the run did not reach step 2"
            time.sleep(0.1)
        victim = next(p for p in _children(proc.pid) if _rank_of(p) == 1)
        os.kill(victim, signal.SIGKILL)
        assert proc.wait(timeout=TIMEOUT_S + 60) == 1  # torchrun's own code for a failed worker
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    saved = _checkpoint_steps(out)[-1]  # whole: published by rename, whatever the kill interrupted
    assert saved >= 2
    torch.set_num_threads(1)
    resumed = worker.run_stage_job({**job, "resume": True, "stop_after": saved + 1})  # here, one process
    straight = worker.run_stage_job({**job, "out": str(tmp_path / "straight"), "stop_after": saved + 1})
    assert [m["step"] for m in resumed["metrics"]] == [saved + 1]
    rel, abs_ = PROCESSES["float64"]
    for key in ("loss_indexer", "loss_lm", "grad_norm_indexer", "grad_norm_model"):
        a, b = straight["metrics"][-1][key], resumed["metrics"][-1][key]
        assert (a is None and b is None) or abs(a - b) <= abs_ + rel * abs(a), (key, a, b)
    errors = worker.weight_errors(straight["weights"], resumed["weights"], "float64")
    assert max(errors.values()) <= 1, sorted(errors.items(), key=lambda kv: -kv[1])[:3]


def test_a_step_that_does_not_split_fails_on_every_rank_with_one_line(tmp_path):
    """Each process as ``torchrun`` starts it, without the agent, which would stop the other rank as
    soon as one exits."""
    command = ["dsa", "warmup", "--out", str(tmp_path / "run"), "--set", "warmup.batch_size=1",
               "--set", "warmup.grad_accum=3"]  # fmt: skip
    for code, output in run_ranks_alone(command, timeout_s=TIMEOUT_S):
        assert code == 2, output[-2000:]
        lines = error_lines(output, "dsv32 dsa")
        assert len(lines) == 1 and "does not split over 2 processes" in lines[0], output[-2000:]
    assert not (tmp_path / "run").exists()
