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


#: Tolerances of a 2-process run against 1 process: (relative, absolute). fp64 weights are compared
#: element by element; fp32 weights by the norm of each tensor's difference relative to its norm (Adam
#: turns the rounding noise of a gradient entry that cancels to ~0 into an update difference of that
#: entry far above its relative rounding).
TOL = {"float64": (1e-10, 0.0), "float32": (1e-5, 1e-7)}


def weight_errors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], dtype: str) -> dict[str, float]:
    """Each tensor's difference as a fraction of what :data:`TOL` allows (> 1: too far apart)."""
    assert a.keys() == b.keys()
    rel, _ = TOL[dtype]
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


class LetterReward:
    """Share of the first 8 generated characters that are lowercase ASCII letters."""

    def score_many(self, samples, max_workers=1):
        from dsv32.rl.grpo.rewards import RewardResult

        out = []
        for s in samples:
            share = sum("a" <= ch <= "z" for ch in s.completion[:8]) / 8
            out.append(RewardResult(total=share, components={"letter": share}, correct=share >= 0.5))
        return out


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
    result = train_grpo(
        rl_config(job),
        policy=policy,
        reward_fn=LetterReward(),
        progress=False,
        resume=job.get("resume", True),
        stop_after=job.get("stop_after"),
    )
    weights = full_weights(policy.model)
    keys = ("step", "world_size", "reward_mean", "pg_loss", "kl", "grad_norm", "ratio_mean", "length_mean")
    metrics = [{k: m.get(k) for k in keys} for m in result.metrics]
    evals = [result.eval_before, result.eval_after]
    return None if weights is None else {"metrics": metrics, "weights": weights, "evals": evals}


class EchoEnv:
    """Tool ``f()`` returns ``RESULT-<task id>``; the answer is correct when it is ``5`` (registered as
    ``echo-dist`` by :func:`register_echo`)."""

    @staticmethod
    def make():
        from dsv32.envs.base import Environment, Reward, tool_call, tool_schema

        class Echo(Environment):
            name = "echo-dist"

            def reset(self, task):
                self.task = task
                return [{"role": "system", "content": "s"}, {"role": "user", "content": task.prompt}]

            def tools(self):
                return [tool_schema("f", "A tool.", {}, [])]

            def call(self, name, arguments):
                return f"RESULT-{self.task.id}" if name == "f" else "error"

            def reward(self, trajectory):
                return Reward(float((trajectory.final or "").strip() == "5"), {}, "")

            def reference(self, task):
                call = tool_call("f", {}, "r0")
                return [
                    {"role": "assistant", "content": "", "reasoning_content": "a", "tool_calls": [call]},
                    {"role": "assistant", "content": "5", "reasoning_content": "b"},
                ]

        return Echo


ECHO_TASKS = [("t0", "q"), ("t1", "q"), ("t2", "q"), ("t3", "q")]


def register_echo():
    from dsv32.envs.base import EnvSpec, Task, register

    tasks = [Task(i, p, "5", "echo-dist") for i, p in ECHO_TASKS]
    register(
        EnvSpec(
            "echo-dist", "test env", EchoEnv.make(), {"train": lambda: tasks, "heldout": lambda: tasks[:2]}
        )
    )
    return tasks


def train_tool_user(out: Path) -> None:
    """A tiny model taught (SFT, memorized) to call ``f`` and then answer ``5``, saved to ``out``:
    its episodes take several model calls."""
    from dsv32.synth.coldstart import add_reasoning
    from dsv32.train.sft import load_sft_config, train_sft
    from dsv32.train.sft.model import prepare_sft_model

    tasks = register_echo()
    env = EchoEnv.make()()
    reference = env.reference(tasks[0])
    tool = {"role": "tool", "tool_call_id": "r0", "content": "RESULT-t0"}
    conv = [*env.reset(tasks[0]), reference[0], tool, reference[1]]
    out.mkdir(parents=True, exist_ok=True)
    (out / "c.jsonl").write_text(json.dumps({"messages": add_reasoning(conv)}) + "\n")
    sets = ["model.name=tiny-llama", "model.device=cpu", f"data.path={out / 'c.jsonl'}", "train.steps=60",
            "train.lr=1e-2", "train.batch_size=1", f"out_dir={out / 'sft'}", "data.seq_len=512"]  # fmt: skip
    sm = prepare_sft_model("tiny-llama", "cpu")
    train_sft(load_sft_config(None, sets), model=sm, progress=False, save_model=False)
    sm.model.save_pretrained(out / "model")
    sm.tokenizer.save_pretrained(out / "model")


def run_agentic_job(job: dict) -> dict | None:
    from dsv32.rl.agentic.config import load_agentic_config
    from dsv32.rl.agentic.trainer import train_agentic
    from dsv32.rl.grpo.policy import load_policy

    register_echo()
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
