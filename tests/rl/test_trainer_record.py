"""The GRPO trainers step for step as recorded: 3 steps of plain GRPO (tiny native MoE model: Keep
Routing, Keep Sampling Mask, a KL term, two mini-batches) and 3 steps of agentic GRPO (a tiny model
taught to call a tool: two-call episodes mixed with single-turn prompts, held-out episodes), each
step's metrics and the final weights' digest against ``data/trainer_record.json``.

The record pins the trainers' numbers so that a reorganisation of the code is proven to change
nothing. On the machine that wrote it (same torch, CPU capability and architecture) every number and
the weights' digest must be equal bit for bit; on another CPU the floats must agree to 1e-5 relative
(kernels differ in their last bits across instruction sets) and the digest is not compared.

Rewrite the record only when a change is meant to change the numbers:
``DSV32_WRITE_RECORD=1 .venv/bin/python -m pytest tests/rl/test_trainer_record.py``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from helpers.agentic import agentic_config
from helpers.record import fingerprint
from helpers.rl import LetterReward, letter_recipe
from helpers.tolerances import OTHER_CPU

from dsv32.rl.agentic.trainer import train_agentic
from dsv32.rl.grpo.policy import load_policy
from dsv32.rl.grpo.single_turn import train_grpo
from dsv32.runlog import read_metrics

RECORD = Path(__file__).parent / "data" / "trainer_record.json"
TIMING = {"seconds", "rollout_s", "update_s", "sync_s"}

pytestmark = pytest.mark.usefixtures("one_thread")


def weights_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _numbers(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in records]


def _check(name: str, got: dict) -> None:
    if os.environ.get("DSV32_WRITE_RECORD"):
        record = json.loads(RECORD.read_text()) if RECORD.is_file() else {}
        record["fingerprint"] = fingerprint()
        record[name] = got
        RECORD.parent.mkdir(parents=True, exist_ok=True)
        RECORD.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        return
    record = json.loads(RECORD.read_text())
    exact = record["fingerprint"] == fingerprint()
    if exact:
        assert got["digest"] == record[name]["digest"], f"{name}: the weights after 3 steps differ"
    _same(record[name]["metrics"], got["metrics"], exact, name)
    _same(record[name].get("eval", []), got.get("eval", []), exact, f"{name} eval")


def _same(want, got, exact: bool, where: str) -> None:
    """``got`` holds every key of ``want`` with the same value (new keys may be added)."""
    if isinstance(want, dict):
        assert isinstance(got, dict), where
        for k, v in want.items():
            assert k in got, f"{where}: {k!r} missing"
            _same(v, got[k], exact, f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (a, b) in enumerate(zip(want, got)):
            _same(a, b, exact, f"{where}[{i}]")
    elif isinstance(want, float) and not exact:
        assert math.isclose(want, got, rel_tol=OTHER_CPU, abs_tol=1e-9) or (
            math.isnan(want) and math.isnan(got)
        ), f"{where}: {got} != {want} (another CPU: {OTHER_CPU:g} relative)"
    elif isinstance(want, float) and math.isnan(want):
        assert isinstance(got, float) and math.isnan(got), where
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def test_plain_grpo_steps_as_recorded(tmp_path):
    over = {
        "grpo.steps": 3,
        "grpo.kl_coef": 0.05,
        "sampling.top_p": 0.9,
        "sampling.top_k": 20,
        "seed": 3,
    }
    cfg = letter_recipe(tmp_path, policy="tiny-native", **over)
    policy = load_policy("tiny-native", device="cpu")
    result = train_grpo(cfg, policy=policy, reward_fn=LetterReward(), progress=False)
    metrics = _numbers(read_metrics(result.out_dir / "metrics.jsonl"))
    got = {"metrics": metrics, "digest": weights_digest(policy.model)}
    assert len(got["metrics"]) == 3
    _check("plain_grpo", got)


def test_agentic_grpo_steps_as_recorded(tool_user, tmp_path):
    over = {"grpo.steps": 3, "grpo.group_size": 4, "sampling.temperature": 0.7, "sampling.top_p": 1.0}
    result = train_agentic(agentic_config(tmp_path, **over), policy=tool_user, progress=False)
    episodes = read_metrics(result.out_dir / "metrics.jsonl")
    evals = [{k: v for k, v in r.items() if k not in ("seconds", "samples")} for r in
             read_metrics(result.out_dir / "eval.jsonl")]  # fmt: skip
    got = {"metrics": _numbers(episodes), "eval": evals, "digest": weights_digest(tool_user.model)}
    assert len(got["metrics"]) == 3 and any("tool_call_valid" in r for r in got["metrics"])
    _check("agentic_grpo", got)
