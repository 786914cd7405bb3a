"""Runs training jobs described in a JSON file, in one process or in each process of a ``torchrun``
launch (the distributed tests compare the two). Rank 0 writes each job's losses and final weights.
Launched as a script (:mod:`helpers.launch`), with ``tests/`` on ``PYTHONPATH``."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch

from dsv32 import distributed
from dsv32.train import ModelSpec, StageConfig, load_dsa_model, train_stage
from helpers.rl import LetterReward
from helpers.tolerances import PROCESSES
from helpers.train import TINY_DSA, token_data

DTYPES = {"float64": torch.float64, "float32": torch.float32}


def weight_errors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], dtype: str) -> dict[str, float]:
    """Each tensor's difference as a fraction of what :data:`helpers.tolerances.PROCESSES` allows (> 1:
    too far apart)."""
    assert a.keys() == b.keys()
    rel, _ = PROCESSES[dtype]
    out = {}
    for n, x in a.items():
        y = b[n]
        assert x.dtype == y.dtype, n
        if dtype == "float64":
            err, scale = float((x - y).abs().max()), float(x.abs().max())
        else:
            err, scale = float((x - y).norm()), float(x.norm())
        out[n] = err / max(rel * scale, 1e-300) if err else 0.0
    return out


def full_weights(model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    with distributed.full_parameters(model) as writer:
        if writer:
            return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters()}
    return None


def run_stage_job(job: dict) -> dict | None:
    dm = load_dsa_model(ModelSpec(name=job["model"]), TINY_DSA)
    dm.model.to(DTYPES[job.get("dtype", "float32")])
    cfg = StageConfig(**job["cfg"])
    result = train_stage(
        dm,
        token_data(n=16),
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


def run_sft_job(job: dict) -> dict | None:
    from dsv32.train.sft import load_sft_config, train_sft
    from dsv32.train.sft.model import prepare_sft_model

    cfg = load_sft_config(None, [f"{k}={json.dumps(v)}" for k, v in job["sets"].items()])
    sm = prepare_sft_model(job["model"], device="cpu")
    sm.model.to(DTYPES[job.get("dtype", "float32")])
    result = train_sft(cfg, model=sm, progress=False, resume=job.get("resume", True))
    weights = full_weights(sm.model)
    keys = ("loss", "grad_norm", "loss_tokens", "world_size", "step")
    metrics = [{k: m.get(k) for k in keys} for m in result.metrics]
    return None if weights is None else {"metrics": metrics, "weights": weights}


def rl_config(job: dict):
    from dsv32.rl.grpo.config import SourceConfig, load_rl_config

    cfg = load_rl_config(None, [f"out_dir={job['out']}", *job["sets"]])
    cfg.sources[0].kind, cfg.sources[0].path, cfg.sources[0].domain = "jsonl", job["tasks"], "toy"
    if job.get("eval"):  # held-out problems come from an arithmetic source
        cfg.sources.append(SourceConfig(kind="arithmetic", max_operand=9, weight=0.5))
    return cfg


def run_rl_job(job: dict) -> dict | None:
    from dsv32.rl.grpo.policy import load_policy
    from dsv32.rl.grpo.single_turn import train_grpo

    policy = load_policy(job["model"], device="cpu")
    policy.model.to(DTYPES[job.get("dtype", "float32")])
    if job.get("index_topk"):  # a native model's DSA selecting below the context
        for layer in policy.model.model.layers:
            layer.self_attn.index_topk = job["index_topk"]
    if job.get("attach_dsa"):  # an HF model with DSA attached in sparse mode, the same indexer everywhere
        from dsv32.dsa import DSAConfig, attach_dsa

        torch.manual_seed(0)
        attach_dsa(policy.model, config=DSAConfig(index_topk=job["attach_dsa"], mode="sparse"))
    result = train_grpo(
        rl_config(job),
        policy=policy,
        reward_fn=LetterReward(),
        progress=False,
        resume=job.get("resume", True),
        stop_after=job.get("stop_after"),
    )
    weights = full_weights(policy.model)
    keys = ("step", "world_size", "reward_mean", "pg_loss", "kl", "grad_norm", "ratio_mean", "length_mean",
            "indexer_loss", "grad_norm_indexer")  # fmt: skip
    metrics = [{k: m.get(k) for k in keys} for m in result.metrics]
    evals = [result.eval_before, result.eval_after]
    return None if weights is None else {"metrics": metrics, "weights": weights, "evals": evals}


def run_agentic_job(job: dict) -> dict | None:
    import helpers.agentic  # noqa: F401  (registers the echo-test environment)
    from dsv32.rl.agentic.config import load_agentic_config
    from dsv32.rl.agentic.trainer import train_agentic
    from dsv32.rl.grpo.policy import load_policy

    policy = load_policy(job["model"], thinking=True, device="cpu")
    policy.model.to(DTYPES[job.get("dtype", "float32")])
    sets = {"out_dir": job["out"], **job["sets"]}
    cfg = load_agentic_config(None, [f"{k}={json.dumps(v)}" for k, v in sets.items()])
    result = train_agentic(
        cfg,
        policy=policy,
        progress=False,
        resume=job.get("resume", True),
        stop_after=job.get("stop_after"),
        evaluate_before=job.get("eval", False),
        evaluate_after=job.get("eval", False),
    )
    weights = full_weights(policy.model)
    evals = [result.eval_before, result.eval_after]
    return None if weights is None else {"metrics": result.metrics, "weights": weights, "evals": evals}


def copy_job(job: dict) -> None:
    if distributed.is_main():
        shutil.copytree(job["src"], job["dst"])


JOBS = {
    "stage": run_stage_job,
    "sft": run_sft_job,
    "rl": run_rl_job,
    "agentic": run_agentic_job,
    "copy": copy_job,
}


def main(spec_path: str) -> None:
    distributed.setup()
    for job in json.loads(Path(spec_path).read_text()):
        out = JOBS[job["kind"]](job)
        if out is not None and job.get("result"):
            torch.save(out, job["result"])
        distributed.barrier()


if __name__ == "__main__":
    main(sys.argv[1])
