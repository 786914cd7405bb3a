"""GRPO under ``torchrun`` (2 processes, gloo, FSDP2) against one process on the same global batch:
the same rollouts, rewards, losses and weights after 3 steps (the groups split over the ranks, the
reference model sharded, Eq. 8's normalisation, the KL and OPSM over the global batch), the held-out
evaluation split over the ranks; a DCP checkpoint written at step 2 by 2 ranks resumes at 1 and at 2
ranks and reproduces step 3, and so does a single-process checkpoint at 2 ranks; the exported model
equals the single-process one; a step whose groups do not split over the ranks fails on every rank
with one line.

Measured here (torch 2.13, CPU): fp64 (8 mini-batches of one output: one rank idle in each) losses
≤ 3e-16 relative, weights ≤ 3.2e-13 (tolerance 1e-10); fp32 losses ≤ 4.6e-6 relative, weights
≤ 3.3e-6 by the norm of each tensor's difference relative to its norm (tolerance 1e-5,
``helpers.tolerances.PROCESSES``).
OPSM's δ is 1e-3, not 0: on the first, on-policy update the divergence is rounding noise around 0,
whose sign δ = 0 would turn into a mask that differs between any two batchings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from helpers import worker
from helpers.launch import error_lines, run_jobs, run_ranks_alone
from helpers.rl import LETTER_TASKS
from helpers.tolerances import PROCESSES
from safetensors.torch import load_file

pytestmark = pytest.mark.distributed

SETS = [
    "policy.name=ignored", "grpo.prompts_per_step=4", "grpo.group_size=2", "grpo.mini_batches=2",
    "grpo.micro_batch=2", "grpo.lr=3e-3", "grpo.kl_coef=0.05", "grpo.opsm_delta=1e-3", "grpo.steps=3",
    "sampling.max_new_tokens=6", "sampling.top_p=0.9", "save_every=1",
    "eval.problems=3", "eval.batch_size=2", "eval.max_new_tokens=4",
]  # fmt: skip
DTYPES = ("float64", "float32")


#: fp64: one output per mini-batch, so in every update one rank has no rows and runs a forward and
#: backward that add nothing (FSDP needs as many on every rank).
EXTRA = {"float64": ["grpo.mini_batches=8"], "float32": []}


def _job(tasks: Path, out: Path, dtype: str, **extra) -> dict:
    return {"kind": "rl", "model": "tiny-llama", "dtype": dtype, "tasks": str(tasks), "out": str(out),
            "sets": SETS + EXTRA[dtype], "eval": True, "resume": False, **extra}  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("rl")
    tasks = root / "toy.jsonl"
    tasks.write_text("".join(json.dumps({"prompt": t.prompt, "domain": "toy"}) + "\n" for t in LETTER_TASKS))
    one, two = root / "one", root / "two"
    torch.set_num_threads(1)
    results = {f"one/{d}": worker.run_rl_job(_job(tasks, one / d, d)) for d in DTYPES}
    worker.run_rl_job(_job(tasks, one / "stop", "float64", stop_after=2))  # a 1-process checkpoint
    stop = _job(tasks, two / "stop", "float64", stop_after=2)
    jobs = [_job(tasks, two / d, d, result=str(two / f"{d}.pt")) for d in DTYPES]
    jobs += [
        stop,
        {"kind": "copy", "src": str(two / "stop"), "dst": str(two / "stop_for_one")},
        {**stop, "stop_after": None, "resume": True, "result": str(two / "resumed_2to2.pt")},
        _job(tasks, one / "stop", "float64", resume=True, result=str(two / "resumed_1to2.pt")),
    ]
    run_jobs(jobs, root / "spec.json")
    results |= {f"two/{d}": torch.load(two / f"{d}.pt") for d in DTYPES}
    results |= {how: torch.load(two / f"resumed_{how}.pt") for how in ("2to2", "1to2")}
    results["2to1"] = worker.run_rl_job(_job(tasks, two / "stop_for_one", "float64", resume=True))
    return root, results


def _close(x: float, y: float, dtype: str, what) -> None:
    rel, abs_ = PROCESSES[dtype]
    assert abs(x - y) <= abs_ + rel * abs(x), (what, x, y)


@pytest.mark.parametrize("dtype", DTYPES)
def test_two_processes_compute_the_single_process_grpo_update(runs, dtype):
    _, results = runs
    one, two = results[f"one/{dtype}"], results[f"two/{dtype}"]
    assert [m["world_size"] for m in one["metrics"]] == [1, 1, 1]
    assert [m["world_size"] for m in two["metrics"]] == [2, 2, 2]
    for x, y in zip(one["metrics"], two["metrics"], strict=True):
        assert x["length_mean"] == y["length_mean"] and x["reward_mean"] == y["reward_mean"]  # same samples
        for key in ("pg_loss", "kl", "grad_norm", "ratio_mean"):
            _close(x[key], y[key], dtype, (key, x["step"]))
    assert any(m["kl"] > 0 for m in one["metrics"][1:])  # the reference model takes part
    errors = worker.weight_errors(one["weights"], two["weights"], dtype)
    assert max(errors.values()) <= 1, sorted(errors.items(), key=lambda kv: -kv[1])[:3]
    for a, b in zip(one["evals"], two["evals"], strict=True):  # split over the ranks, the same result
        assert a["problems"] == b["problems"] == 3
        assert (a["accuracy"], a["reward"], a["mean_tokens"], a["samples"]) == (
            b["accuracy"], b["reward"], b["mean_tokens"], b["samples"]
        )  # fmt: skip


@pytest.mark.parametrize("how", ["2to2", "2to1", "1to2"])
def test_a_grpo_checkpoint_resumes_at_another_world_size_and_reproduces_step_3(runs, how):
    root, results = runs
    straight, resumed = results["one/float64"], results[how]
    assert [m["step"] for m in resumed["metrics"]] == [3]
    assert resumed["metrics"][0]["world_size"] == int(how[-1])
    for key in ("pg_loss", "kl", "grad_norm"):
        _close(straight["metrics"][-1][key], resumed["metrics"][0][key], "float64", key)
    errors = worker.weight_errors(straight["weights"], resumed["weights"], "float64")
    assert max(errors.values()) <= 1, sorted(errors.items(), key=lambda kv: -kv[1])[:3]
    ckpt = root / "two" / "stop" / "checkpoints" / "step_000003"
    assert (ckpt / "dcp" / ".metadata").is_file() and (ckpt / "rng_rank00001.pt").is_file()
    rows = [json.loads(x) for x in (root / "two" / "stop" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]  # rank 0 alone logs, once per step


def test_the_exported_grpo_model_equals_the_single_process_one(runs):
    root, _ = runs
    exported = load_file(root / "two" / "float64" / "model" / "model.safetensors")
    reference = load_file(root / "one" / "float64" / "model" / "model.safetensors")
    assert max(worker.weight_errors(reference, exported, "float64").values()) <= 1


def test_grpo_groups_that_do_not_split_fail_on_every_rank_with_one_line(tmp_path):
    command = ["rl", "train", "--out", str(tmp_path / "run"), "--set", "grpo.prompts_per_step=3"]
    for code, output in run_ranks_alone(command, timeout_s=30):
        assert code == 2, output[-2000:]
        lines = error_lines(output, "dsv32 rl")
        assert len(lines) == 1 and "prompts_per_step=3 does not split over 2 processes" in lines[0], output[
            -2000:
        ]
    assert not (tmp_path / "run").exists()
