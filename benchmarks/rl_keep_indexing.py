"""Keep Indexing: the training forward with and without the engine's recorded DSA selections.

Two tiny models in sparse mode with top-k (4) below the context: the native V3.2 model and tiny-llama
with DSA attached. Samples are drawn by an engine one indexer update behind: after sampling, the
trainer's indexer takes AdamW steps on its KL loss (Eq. 4) over the batch, so its selections differ
from the engine's while every other weight is the same. The trainer's log-probs of the sampled tokens
against the engine's: with the selections replayed (``replayed_max_abs_log_ratio``: what is left is
kernel rounding) and recomputed (``unreplayed_max_abs_log_ratio``); ``selection_mismatch_fraction``:
the share of (layer, position) selections that differ. ``indexer_loss_first``/``_last``: a few GRPO
steps of the native model with the indexer loss on (the step record's ``indexer_loss``).
``distributed_max_rel_diff`` is not measured here (null).

    python benchmarks/rl_keep_indexing.py [--json] [--quick] [--out DIR]

Writes runs/bench/rl_keep_indexing.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

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


def indexer_loss_curve(steps: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "toy.jsonl"
        path.write_text(
            "".join(json.dumps({"prompt": p, "domain": "toy"}) + "\n" for p in ("ab", "xyz", "hello", "q"))
        )
        sets = [
            f"out_dir={tmp}/run", "policy.name=tiny-native", "grpo.prompts_per_step=4", "grpo.group_size=4",
            "grpo.mini_batches=2", "grpo.micro_batch=8", "grpo.lr=1e-3", "grpo.indexer_lr=3e-3",
            f"grpo.steps={steps}", "sampling.max_new_tokens=16", "eval.problems=0",
        ]  # fmt: skip
        cfg = load_rl_config(None, sets)
        cfg.sources[0].kind, cfg.sources[0].path, cfg.sources[0].domain = "jsonl", str(path), "toy"
        policy = load_policy("tiny-native", device="cpu")
        result = train_grpo(cfg, policy=policy, reward_fn=Letters(), progress=False)
        return [r["indexer_loss"] for r in read_metrics(result.out_dir / "metrics.jsonl")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--quick", action="store_true", help="fewer GRPO steps")
    ap.add_argument("--out", default="runs/bench", help="output directory")
    args = ap.parse_args()
    torch.manual_seed(0)
    per_model = {name: mismatch(name, steps=3) for name in ("tiny-native", "tiny-llama")}
    curve = indexer_loss_curve(3 if args.quick else 6)
    result = {
        "models": per_model,
        "replayed_max_abs_log_ratio": max(v["replayed"] for v in per_model.values()),
        "unreplayed_max_abs_log_ratio": max(v["unreplayed"] for v in per_model.values()),
        "selection_mismatch_fraction": min(v["mismatch"] for v in per_model.values()),
        "indexer_loss_first": curve[0],
        "indexer_loss_last": curve[-1],
        "indexer_loss": curve,
        "distributed_max_rel_diff": None,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
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
