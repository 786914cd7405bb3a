"""Keep Indexing: the training forward with and without the engine's recorded DSA selections.

Two tiny models in sparse mode with top-k (4) below the context: the native V3.2 model and tiny-llama
with DSA attached. Samples are drawn by an engine one indexer update behind: after sampling, the
trainer's indexer takes AdamW steps on its KL loss (Eq. 4) over the batch, so its selections differ
from the engine's while every other weight is the same. The trainer's log-probs of the sampled tokens
against the engine's: with the selections replayed (``replayed_max_abs_log_ratio``: what is left is
kernel rounding) and recomputed (``unreplayed_max_abs_log_ratio``); ``selection_mismatch_fraction``:
the share of (layer, position) selections that differ. ``indexer_loss_first``/``_last``: a few GRPO
steps of the native model with the indexer loss on (the step record's ``indexer_loss``), the policy at
lr 1e-4 and the indexer at 3e-3 (a policy that moves faster moves the loss's targets, the attention,
faster than this indexer follows them: at policy lr 1e-3 the loss holds at about 9e-5).

``distributed_max_rel_diff``: 3 GRPO steps of each model (top-k 4, Keep Indexing and the indexer
loss on, fp32) in 2 processes (``torchrun``, gloo, FSDP2; the groups split over the ranks)
against 1 process on the same global batch: the largest relative difference of the final weights
(each tensor's norm of the difference over its norm) and of the step metrics ``kl``, ``grad_norm``,
``ratio_mean`` and ``grad_norm_indexer`` (|a − b| / |a|). Two metrics are given apart as absolute
differences: ``pg_loss``, a mean of advantages that cancel to about 0, and ``indexer_loss``, a KL of
~1e-4 between nearly equal distributions, which moves by ~1e-8 when its fp32 inputs move by their
rounding (another batch layout) — its gradient, and so the indexer's weights, do not.
``distributed`` holds each part by model, and the same comparison without replay.

    python benchmarks/rl_keep_indexing.py [--json] [--quick] [--out DIR]

Writes runs/bench/rl_keep_indexing.json.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from dsv32 import distributed
from dsv32.dsa import DSAConfig, attach_dsa, get_dsa
from dsv32.engine import generate
from dsv32.rl.grpo.config import load_rl_config
from dsv32.rl.grpo.indexing import indexer_losses, is_indexer_parameter
from dsv32.rl.grpo.policy import load_policy
from dsv32.rl.grpo.rewards import RewardResult
from dsv32.rl.grpo.single_turn import train_grpo
from dsv32.runlog import read_metrics

TOPK = 4


def _forward(m, ids, mask, indexing=None, record=False):
    if hasattr(m, "set_dsa_mode"):
        out = m(ids, attention_mask=mask, indexing=indexing, return_indexing=record)
        return out.logits, out.indexing
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    with get_dsa(m).indexing(forced=indexing, record=record) as handle:
        out = m(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
        return out.logits, handle.stacked_indexing() if record else None


def mismatch(name: str, steps: int) -> dict:
    policy = load_policy(name, device="cpu")
    m = policy.model.eval()
    if name == "tiny-native":
        for layer in m.model.layers:
            layer.self_attn.index_topk = TOPK
    else:
        attach_dsa(m, config=DSAConfig(index_topk=TOPK, mode="sparse"))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (12, 7, 20, 15)]
    out = generate(m, prompts, max_new_tokens=16, eos_token_id=[], generator=g, return_indexing=True)
    seq, mask = out.sequences, out.attention_mask
    ids, am = seq[:, :-1], mask[:, :-1]
    params = [p for n, p in m.named_parameters() if is_indexer_parameter(n)]
    opt = torch.optim.AdamW(params, lr=3e-2)
    for _ in range(steps):  # the trainer's indexer one update ahead of the engine's
        with indexer_losses(m, True) as losses:
            _forward(m, ids, am)
        (sum(losses.values()) / len(losses)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    N = out.tokens.shape[1]
    with torch.no_grad():
        replayed, _ = _forward(m, ids, am, indexing=out.indexing)
        own, rec = _forward(m, ids, am, record=True)

    def log_ratio(logits):
        logp = torch.log_softmax(logits[:, -N:].float(), -1).gather(-1, seq[:, -N:, None])[..., 0]
        return float((logp - out.logprobs).abs().max())

    real = am.bool()[None].expand(rec.shape[:3])
    differ = (rec.sort(-1).values != out.indexing.sort(-1).values).any(-1)
    return {
        "replayed": log_ratio(replayed),
        "unreplayed": log_ratio(own),
        "mismatch": float(differ[real].float().mean()),
    }


class Letters:
    def score_many(self, samples, max_workers=1):
        out = []
        for s in samples:
            share = sum("a" <= ch <= "z" for ch in s.completion[:8]) / 8
            out.append(RewardResult(total=share, components={"letter": share}, correct=share >= 0.5))
        return out


PROMPTS = ("ab", "xyz", "hello", "q")


def indexer_loss_curve(steps: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "toy.jsonl"
        path.write_text("".join(json.dumps({"prompt": p, "domain": "toy"}) + "\n" for p in PROMPTS))
        sets = [
            f"out_dir={tmp}/run", "policy.name=tiny-native", "grpo.prompts_per_step=4", "grpo.group_size=4",
            "grpo.mini_batches=2", "grpo.micro_batch=8", "grpo.lr=1e-4", "grpo.indexer_lr=3e-3",
            f"grpo.steps={steps}", "sampling.max_new_tokens=16", "eval.problems=0",
        ]  # fmt: skip
        cfg = load_rl_config(None, sets)
        cfg.sources[0].kind, cfg.sources[0].path, cfg.sources[0].domain = "jsonl", str(path), "toy"
        policy = load_policy("tiny-native", device="cpu")
        result = train_grpo(cfg, policy=policy, reward_fn=Letters(), progress=False)
        return [r["indexer_loss"] for r in read_metrics(result.out_dir / "metrics.jsonl")]


#: The distributed comparison's recipe: 4 prompts × 2 outputs a step split over the ranks by whole
#: groups, 2 mini-batches of micro-batches of 2, a KL term and OPSM (δ 1e-3: on the first, on-policy
#: update the divergence is rounding noise around 0, whose sign δ = 0 would turn into a mask).
DIST_SETS = [
    "grpo.prompts_per_step=4", "grpo.group_size=2", "grpo.mini_batches=2",
    "grpo.micro_batch=2", "grpo.lr=3e-3", "grpo.indexer_lr=3e-3", "grpo.kl_coef=0.05",
    "grpo.opsm_delta=1e-3", "grpo.steps=3", "sampling.max_new_tokens=6", "sampling.top_p=0.9",
    "save_every=0", "eval.problems=0",
]  # fmt: skip
DIST_METRICS = ("kl", "grad_norm", "ratio_mean", "grad_norm_indexer")
DIST_ABSOLUTE = ("pg_loss", "indexer_loss")


def grpo_job(job: dict) -> dict | None:
    """One GRPO run of ``job["model"]`` (the native model, or tiny-llama with DSA attached; top-k
    ``TOPK``) in this process or in each of a ``torchrun`` launch's; rank 0 returns its step records
    and the full final weights."""
    sets = [f"out_dir={job['out']}", *DIST_SETS, f"policy.name={job['model']}", *job["sets"]]
    cfg = load_rl_config(None, sets)
    cfg.sources[0].kind, cfg.sources[0].path, cfg.sources[0].domain = "jsonl", job["tasks"], "toy"
    policy = load_policy(job["model"], device="cpu")
    if job["model"] == "tiny-native":
        for layer in policy.model.model.layers:
            layer.self_attn.index_topk = TOPK
    else:  # the same initial indexer in every process
        torch.manual_seed(0)
        attach_dsa(policy.model, config=DSAConfig(index_topk=TOPK, mode="sparse"))
    result = train_grpo(cfg, policy=policy, reward_fn=Letters(), progress=False, resume=False)
    with distributed.full_parameters(policy.model) as writer:
        if not writer:
            return None
        weights = {n: p.detach().to("cpu", copy=True) for n, p in policy.model.named_parameters()}
    return {"metrics": result.metrics, "weights": weights}


def worker(spec: str) -> None:
    """``--worker SPEC``: each job of the JSON file ``SPEC`` in this rank of a ``torchrun`` launch."""
    distributed.setup()
    torch.set_num_threads(1)
    for job in json.loads(Path(spec).read_text()):
        out = grpo_job(job)
        if out is not None:
            torch.save(out, job["result"])
        distributed.barrier()


def _torchrun(spec: Path, nproc: int = 2) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    src = Path(__file__).resolve().parents[1] / "src"
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")])
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
        "--master-addr", "127.0.0.1", "--master-port", str(port), "--max-restarts", "0",
        str(Path(__file__).resolve()), "--worker", str(spec),
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    if proc.returncode:
        raise RuntimeError(
            f"torchrun failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}"
        )


def compare(one: dict, two: dict) -> dict:
    """The largest relative differences of 2 processes' run against 1 process's (see the docstring)."""
    metrics = dict.fromkeys(DIST_METRICS, 0.0)
    absolute = dict.fromkeys(DIST_ABSOLUTE, 0.0)
    for a, b in zip(one["metrics"], two["metrics"], strict=True):
        for k in DIST_METRICS:
            metrics[k] = max(metrics[k], abs(a[k] - b[k]) / abs(a[k]))
        for k in DIST_ABSOLUTE:
            absolute[k] = max(absolute[k], abs(a[k] - b[k]))
    w = {
        n: float((x - two["weights"][n]).norm() / x.norm())
        if x.norm() > 0
        else float((two["weights"][n]).norm())
        for n, x in one["weights"].items()
    }
    worst = max(w, key=w.get)
    return {
        "max_rel_diff": max(max(metrics.values()), w[worst]),
        "metrics_rel_diff": metrics,
        "weights_max_rel_diff": w[worst],
        "weights_worst": worst,
        "metrics_abs_diff": absolute,
        "indexer_loss": [m["indexer_loss"] for m in one["metrics"]],
        "steps": len(one["metrics"]),
        "same_samples": all(
            (a["reward_mean"], a["length_mean"]) == (b["reward_mean"], b["length_mean"])
            for a, b in zip(one["metrics"], two["metrics"], strict=True)
        ),
        "world_sizes": [two["metrics"][0]["world_size"], one["metrics"][0]["world_size"]],
    }


def distributed_comparison(model: str) -> dict:
    """GRPO of ``model`` in 2 processes against 1, with the selections replayed and without."""
    torch.set_num_threads(1)
    arms = {"replayed": ["grpo.keep_indexing=true"], "unreplayed": ["grpo.keep_indexing=false"]}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tasks = root / "toy.jsonl"
        tasks.write_text("".join(json.dumps({"prompt": p, "domain": "toy"}) + "\n" for p in PROMPTS))
        jobs = {a: {"model": model, "tasks": str(tasks), "sets": sets} for a, sets in arms.items()}
        one = {a: grpo_job({**j, "out": str(root / f"one_{a}")}) for a, j in jobs.items()}
        spec = root / "spec.json"
        spec.write_text(json.dumps([
            {**j, "out": str(root / f"two_{a}"), "result": str(root / f"two_{a}.pt")} for a, j in jobs.items()
        ]))  # fmt: skip
        _torchrun(spec)
        return {a: compare(one[a], torch.load(root / f"two_{a}.pt")) for a in arms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--quick", action="store_true", help="fewer GRPO steps")
    ap.add_argument("--out", default="runs/bench", help="output directory")
    ap.add_argument("--worker", metavar="SPEC", help=argparse.SUPPRESS)  # a rank of the comparison
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    per_model = {name: mismatch(name, steps=3) for name in ("tiny-native", "tiny-llama")}
    curve = indexer_loss_curve(3 if args.quick else 6)
    dist = {name: distributed_comparison(name) for name in ("tiny-native", "tiny-llama")}
    result = {
        "models": per_model,
        "replayed_max_abs_log_ratio": max(v["replayed"] for v in per_model.values()),
        "unreplayed_max_abs_log_ratio": max(v["unreplayed"] for v in per_model.values()),
        "selection_mismatch_fraction": min(v["mismatch"] for v in per_model.values()),
        "indexer_loss_first": curve[0],
        "indexer_loss_last": curve[-1],
        "indexer_loss": curve,
        "distributed_max_rel_diff": max(d["replayed"]["max_rel_diff"] for d in dist.values()),
        "distributed": dist,
        "torch": torch.__version__,
        "threads": threads,
        "distributed_threads": 1,
    }
    out = Path(args.out) / "rl_keep_indexing.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    if not args.json:
        for k, v in result.items():
            print(f"{k}: {v}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
