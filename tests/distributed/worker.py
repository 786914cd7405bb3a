"""Runs training jobs described in a JSON file, in one process or in each process of a ``torchrun``
launch (the distributed tests compare the two). Rank 0 writes each job's losses and final weights."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch

from dsv32 import distributed
from dsv32.dsa import DSAConfig
from dsv32.train import ModelSpec, StageConfig, TokenData, load_dsa_model, train_stage

DSA = DSAConfig(index_n_heads=2, index_head_dim=16, index_topk=8)
DTYPES = {"float64": torch.float64, "float32": torch.float32}


def token_data(n=16, T=32, seed=0) -> TokenData:
    g = torch.Generator().manual_seed(seed)
    return TokenData.from_sequences(
        torch.randint(0, 257, (n, T), generator=g), torch.randint(0, 257, (4, T), generator=g)
    )


def full_weights(model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    with distributed.full_parameters(model) as writer:
        if writer:
            return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters()}
    return None


def run_stage_job(job: dict) -> dict | None:
    dm = load_dsa_model(ModelSpec(name=job["model"]), DSA)
    dm.model.to(DTYPES[job.get("dtype", "float32")])
    cfg = StageConfig(**job["cfg"])
    result = train_stage(
        dm,
        token_data(),
        cfg,
        job["out"],
        progress=False,
        resume=job.get("resume", True),
        stop_after=job.get("stop_after"),
    )
    weights = full_weights(dm.model)
    keys = ("loss_indexer", "loss_lm", "grad_norm_indexer", "grad_norm_model", "world_size", "step")
    metrics = [{k: m.get(k) for k in keys} for m in result.metrics]
    return None if weights is None else {"metrics": metrics, "weights": weights}


def copy_job(job: dict) -> None:
    if distributed.is_main():
        shutil.copytree(job["src"], job["dst"])


JOBS = {"stage": run_stage_job, "copy": copy_job}


def main(spec_path: str) -> None:
    distributed.setup()
    for job in json.loads(Path(spec_path).read_text()):
        out = JOBS[job["kind"]](job)
        if out is not None and job.get("result"):
            torch.save(out, job["result"])
        distributed.barrier()


if __name__ == "__main__":
    main(sys.argv[1])
