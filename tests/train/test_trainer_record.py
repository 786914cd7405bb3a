"""Three steps of each trainer on tiny models against a stored record: the DSA dense warm-up, the DSA
sparse stage and SFT, each run through the package's public entry points (``dsv32.train`` and
``dsv32.train.sft``). Per step the losses and gradient norms are compared, and after step 3 a
SHA-256 digest of the weights (every parameter tensor's bytes, in name order).

On the machine that wrote the record (same torch version, CPU capability and architecture: the
``fingerprint``) every float must be equal and the digest identical, bit for bit. On another
machine floating-point reductions may round differently, so the floats are compared within a
relative 1e-5 and the digest is not compared.

The record is ``tests/train/data/trainer_record.json``. To write it anew (after a deliberate change
of what the trainers compute), run this module with ``DSV32_WRITE_RECORD=1``::

    DSV32_WRITE_RECORD=1 .venv/bin/python -m pytest tests/train/test_trainer_record.py

(``-k sft`` and the like rewrites one trainer's entry and keeps the others).
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

from helpers.record import fingerprint
from helpers.tolerances import OTHER_CPU
from helpers.train import token_data

from dsv32.train import load_dsa_model, load_run_config, train_stage
from dsv32.train.sft import load_sft_config, prepare_sft_model, train_sft

RECORD = Path(__file__).parent / "data" / "trainer_record.json"
TINY_CPU = Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu.toml"
WRITE = os.environ.get("DSV32_WRITE_RECORD") == "1"
DSA_KEYS = ("loss_indexer", "loss_lm", "grad_norm_indexer", "grad_norm_model")
SFT_KEYS = ("loss", "eval_loss", "grad_norm")

# The tiny-cpu recipe scaled to a tiny random Llama: DSA on both layers, 32-token sequences, top-8,
# two micro-batches per step, the learning-rate warm-up and the query subsample switched on.
DSA_SETTINGS = {
    "model.name": "tiny-llama",
    "model.device": "cpu",
    "dsa.index_n_heads": 2,
    "dsa.index_head_dim": 16,
    "dsa.index_topk": 8,
    "dsa.layers": [0, 1],
    "data.seq_len": 32,
    "warmup.steps": 3,
    "warmup.batch_size": 2,
    "warmup.grad_accum": 2,
    "warmup.lr": 3e-3,
    "warmup.warmup_steps": 1,
    "warmup.loss_queries": 20,
    "sparse.steps": 3,
    "sparse.batch_size": 2,
    "sparse.grad_accum": 2,
    "sparse.lr": 1e-3,
    "sparse.indexer_lr": 3e-3,
    "sparse.weight_decay": 0.1,
    "sparse.warmup_steps": 1,
    "sparse.loss_queries": 20,
}


def digest(model: torch.nn.Module) -> str:
    """SHA-256 of every parameter tensor's bytes, in name order."""
    h = hashlib.sha256()
    for _, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _steps(metrics: list[dict], keys: tuple[str, ...]) -> list[dict]:
    return [{k: float(m[k]) for k in keys if m.get(k) is not None} for m in metrics]


def run_dsa(stage: str, tmp_path: Path) -> dict:
    cfg = load_run_config(TINY_CPU, [f"{k}={json.dumps(v)}" for k, v in DSA_SETTINGS.items()])
    dm = load_dsa_model(cfg.model, cfg.dsa)
    result = train_stage(dm, token_data(), getattr(cfg, stage), tmp_path / stage, progress=False)
    assert result.steps == 3
    return {"steps": _steps(result.metrics, DSA_KEYS), "digest": digest(dm.model)}


def _conversation(a: int, b: int) -> dict:
    call = {"id": "c", "type": "function", "function": {"name": "python", "arguments": {"code": f"{a}*{b}"}}}
    return {
        "messages": [
            {"role": "user", "content": f"{a}*{b}?"},
            {"role": "assistant", "content": "", "reasoning_content": "py", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c", "content": str(a * b)},
            {"role": "assistant", "content": f"\\boxed{{{a * b}}}", "reasoning_content": "ok"},
        ]
    }


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def run_sft(tmp_path: Path) -> dict:
    settings = {
        "model.name": "tiny-llama",
        "model.device": "cpu",
        "data.path": _jsonl(tmp_path / "train.jsonl", [_conversation(a, a + 7) for a in range(3, 11)]),
        "data.eval_path": _jsonl(tmp_path / "held.jsonl", [_conversation(a, 2 * a) for a in (91, 92)]),
        "data.seq_len": 512,
        "data.packing": True,
        "train.batch_size": 2,
        "train.grad_accum": 2,
        "train.lr": 3e-3,
        "train.warmup_steps": 1,
        "train.new_token_lr": 1e-2,
        "train.steps": 3,
        "train.eval_every": 2,
        "out_dir": str(tmp_path / "sft"),
    }
    cfg = load_sft_config(None, [f"{k}={json.dumps(v)}" for k, v in settings.items()])
    sm = prepare_sft_model(cfg.model.name, cfg.model.device)
    result = train_sft(cfg, model=sm, progress=False)
    assert result.steps == 3
    return {"steps": _steps(result.metrics, SFT_KEYS), "digest": digest(sm.model)}


def _write(name: str, observed: dict) -> None:
    record = json.loads(RECORD.read_text()) if RECORD.is_file() else {}
    record["fingerprint"] = fingerprint()
    record.setdefault("trainers", {})[name] = observed
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    RECORD.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


@pytest.mark.parametrize("name", ["dsa_warmup", "dsa_sparse", "sft"])
def test_three_steps_match_the_record(name, tmp_path, one_thread):
    observed = run_sft(tmp_path) if name == "sft" else run_dsa(name.removeprefix("dsa_"), tmp_path)
    if WRITE:
        _write(name, observed)
        return
    record = json.loads(RECORD.read_text())
    expected = record["trainers"][name]
    same_machine = record["fingerprint"] == fingerprint()
    assert [sorted(s) for s in observed["steps"]] == [sorted(s) for s in expected["steps"]]
    for step, (got, want) in enumerate(zip(observed["steps"], expected["steps"], strict=True), 1):
        for key, value in want.items():
            where = f"{name} step {step} {key}: {got[key]!r} vs recorded {value!r}"
            if same_machine:
                assert got[key] == value, f"{where} (same fingerprint: must be bit for bit equal)"
            else:
                assert math.isclose(got[key], value, rel_tol=OTHER_CPU), (
                    f"{where} (fingerprint {fingerprint()} differs from the record's "
                    f"{record['fingerprint']}: compared within rel {OTHER_CPU:g}, weight digest not compared)"
                )
    if same_machine:
        assert observed["digest"] == expected["digest"], f"{name}: weights after step 3 differ bit for bit"
