"""The DSA stages under ``torchrun`` (2 processes, gloo, FSDP2, DCP) against one process on the
same global batch: the same losses, gradient norms and weights after 3 steps; a DCP checkpoint
written at step 2 by 2 ranks resumes at 1 and at 2 ranks and reproduces step 3; a single-process
checkpoint resumes at 2 ranks; the exported model equals the single-process one.

Measured here (torch 2.13, CPU): the fp64 runs agree to ≤ 5e-16 relative in losses, gradient norms
and weights (tolerance 1e-10). The native model computes its norms and attention in fp32 whatever its
dtype, so it runs in fp32: LM loss 4e-8 and gradient norms ≤ 7e-7 relative, indexer loss (a KL near
zero, ~1e-4) 6e-9 absolute, weights ≤ 4.7e-6 by the norm of each tensor's difference relative to its
norm (an indexer norm bias that starts at zero; the model's weights ≤ 4e-7) — tolerances in
``helpers.tolerances.PROCESSES``: 1e-5 relative plus 1e-7 absolute for the losses."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from helpers import worker
from helpers.launch import run_jobs
from helpers.tolerances import PROCESSES
from helpers.train import TINY_DSA
from safetensors.torch import load_file

from dsv32.train import read_metrics

pytestmark = pytest.mark.distributed

# (job name, model, dtype, stage config): whole micro-batches per rank (grad_accum 2) and a micro-batch
# split by rows (batch_size 2, grad_accum 1), the online indexer loss and the warm-up's replay.
JOBS = [
    ("warmup", "tiny-llama", "float64",
     {"stage": "warmup", "batch_size": 2, "grad_accum": 2, "lr": 1e-2, "loss_queries": 20, "save_every": 1}),
    ("replay", "tiny-llama", "float64",
     {"stage": "warmup", "batch_size": 2, "grad_accum": 1, "lr": 1e-2, "replay": 2, "replay_pool": 4}),
    ("sparse", "tiny-llama", "float64",
     {"stage": "sparse", "batch_size": 1, "grad_accum": 2, "lr": 1e-3, "index_topk": 8, "loss_queries": 20}),
    ("native", "tiny-native", "float32",
     {"stage": "sparse", "batch_size": 2, "grad_accum": 1, "lr": 1e-3, "index_topk": 8}),
]  # fmt: skip


def _job(name, model, dtype, cfg, out, **extra):
    return {
        "kind": "stage",
        "model": model,
        "dtype": dtype,
        "cfg": {**cfg, "steps": 3},
        "out": str(out),
        **extra,
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every job at 1 process (in this one) and at 2 (one torchrun launch), plus the resumes."""
    root = tmp_path_factory.mktemp("dist")
    one, two = root / "one", root / "two"
    one.mkdir(), two.mkdir()
    results: dict[str, dict] = {}
    torch.set_num_threads(1)
    for name, model, dtype, cfg in JOBS:
        results[f"one/{name}"] = worker.run_stage_job(_job(name, model, dtype, cfg, one / name, resume=False))
    warm = JOBS[0]
    worker.run_stage_job(_job(*warm, one / "stop", resume=False, stop_after=2))  # a 1-process checkpoint
    jobs = [_job(*j, two / j[0], resume=False, result=str(two / f"{j[0]}.pt")) for j in JOBS]
    jobs += [
        _job(*warm, two / "stop", resume=False, stop_after=2),
        {"kind": "copy", "src": str(two / "stop"), "dst": str(two / "stop_for_one")},
        _job(*warm, two / "stop", result=str(two / "resumed_2to2.pt")),
        _job(*warm, one / "stop", result=str(two / "resumed_1to2.pt")),
    ]
    run_jobs(jobs, root / "spec.json")
    for name, *_ in JOBS:
        results[f"two/{name}"] = torch.load(two / f"{name}.pt")
    for how in ("2to2", "1to2"):
        results[how] = torch.load(two / f"resumed_{how}.pt")
    results["2to1"] = worker.run_stage_job(_job(*warm, two / "stop_for_one"))
    return root, results


def _close(a, b, dtype, what):
    rel, abs_ = PROCESSES[dtype]
    assert abs(a - b) <= abs_ + rel * abs(a), f"{what}: {a} vs {b}"


def _same_run(a: dict, b: dict, dtype: str) -> None:
    assert [m["step"] for m in a["metrics"]] == [m["step"] for m in b["metrics"]]
    for x, y in zip(a["metrics"], b["metrics"]):
        for key in ("loss_indexer", "loss_lm", "grad_norm_indexer", "grad_norm_model"):
            if x[key] is None:
                assert y[key] is None
            else:
                _close(x[key], y[key], dtype, f"step {x['step']} {key}")
    errors = worker.weight_errors(a["weights"], b["weights"], dtype)
    assert max(errors.values()) <= 1, sorted(errors.items(), key=lambda kv: -kv[1])[:3]


@pytest.mark.parametrize("name,model,dtype,cfg", JOBS, ids=[j[0] for j in JOBS])
def test_two_processes_compute_the_single_process_update(runs, name, model, dtype, cfg):
    root, results = runs
    one, two = results[f"one/{name}"], results[f"two/{name}"]
    assert [m["world_size"] for m in one["metrics"]] == [1, 1, 1]
    assert [m["world_size"] for m in two["metrics"]] == [2, 2, 2]
    _same_run(one, two, dtype)
    before = worker.load_dsa_model(worker.ModelSpec(name=model), TINY_DSA).model.to(worker.DTYPES[dtype])
    moved = [n for n, p in before.named_parameters() if not torch.equal(p.detach(), two["weights"][n])]
    assert moved  # the run trained something
    # rank 0 alone wrote the log: one row per step
    rows = read_metrics(root / "two" / name / "metrics.jsonl")
    assert [(r["step"], r["world_size"]) for r in rows] == [(1, 2), (2, 2), (3, 2)]


@pytest.mark.parametrize("how", ["2to2", "2to1", "1to2"])
def test_a_checkpoint_resumes_at_another_world_size_and_reproduces_step_3(runs, how):
    root, results = runs
    straight, resumed = results["one/warmup"], results[how]
    assert [m["step"] for m in resumed["metrics"]] == [3]
    _close(straight["metrics"][-1]["loss_indexer"], resumed["metrics"][-1]["loss_indexer"], "float64", "loss")
    _same_run({**straight, "metrics": straight["metrics"][-1:]}, resumed, "float64")
    if how == "2to2":  # the same world size: bit for bit
        assert all(torch.equal(t, resumed["weights"][n]) for n, t in results["two/warmup"]["weights"].items())
    written = root / ("two/stop" if how == "2to2" else "two/stop_for_one" if how == "2to1" else "one/stop")
    state = json.loads((written / "checkpoints" / "step_000003" / "state.json").read_text())
    assert state["step"] == 3 and state.get("world_size", 1) == int(how[-1])


def test_a_distributed_checkpoint_is_dcp_with_per_rank_rng(runs):
    root, _ = runs
    ckpt = root / "two" / "stop_for_one" / "checkpoints" / "step_000002"
    names = {p.name for p in ckpt.iterdir()}
    assert {"dcp", "state.json", "rng_rank00000.pt", "rng_rank00001.pt"} <= names
    assert (ckpt / "dcp" / ".metadata").is_file()
    assert json.loads((ckpt / "state.json").read_text())["world_size"] == 2
    assert not any(p.name.startswith(".tmp") for p in ckpt.parent.iterdir())


@pytest.mark.parametrize("name", ["warmup", "sparse"])
def test_the_exported_model_equals_the_single_process_one(runs, name):
    root, _ = runs
    a, b = root / "one" / name / "model", root / "two" / name / "model"
    files = sorted(p.name for p in a.glob("*.safetensors"))
    assert files and files == sorted(p.name for p in b.glob("*.safetensors"))
    assert (name == "sparse") == ("model.safetensors" in files)  # the sparse stage exports the whole model
    for f in files:
        x, y = load_file(a / f), load_file(b / f)
        assert x.keys() == y.keys()
        for k in x:
            assert torch.allclose(x[k], y[k], rtol=1e-10, atol=0), f"{f}: {k}"
