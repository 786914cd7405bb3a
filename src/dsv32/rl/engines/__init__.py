"""Rollout engines behind one interface (:class:`RolloutEngine`, whose capabilities every engine
declares): the in-process engine (the reference) and a remote engine over HTTP (``dsv32 serve`` or
vLLM, the wire format typed in :mod:`dsv32.engine.wire`), with the weight syncs beside them (one
``push`` each, :class:`WeightSync`). See docs/rl.md, "Scaling out"."""

from __future__ import annotations

from pathlib import Path

import torch

from dsv32.engine.weight_files import WeightFileError, load_weights, save_weights
from dsv32.rl.engines.base import (
    EngineError,
    EngineOutput,
    RolloutEngine,
    StaleSampleError,
    WarnOnce,
    check_staleness,
    prepare_engine,
    run_calls,
    split_calls,
)
from dsv32.rl.engines.http import EngineClient
from dsv32.rl.engines.in_process import InProcessEngine
from dsv32.rl.engines.remote import RemoteEngine
from dsv32.rl.engines.weight_sync import CollectiveWeightSync, FileWeightSync, WeightSync, weight_sync


def build_engine(cfg, model, out_dir: str | Path) -> RolloutEngine:
    """The engine of a recipe's ``[engine]`` section (:class:`~dsv32.rl.grpo.config.EngineConfig`);
    ``model`` is the trainer's (the in-process engine samples with it). Nothing is sent to a remote
    engine yet: its first use (or :meth:`RolloutEngine.connect`) reaches it."""
    if cfg.kind == "in_process":  # "float32": the trainer's model itself, whatever its own dtype
        return InProcessEngine(model, dtype=None if cfg.dtype == "float32" else cfg.dtype)
    device = next(model.parameters()).device if isinstance(model, torch.nn.Module) else "cpu"
    sync = weight_sync(
        cfg.sync, cfg.sync_dir or Path(out_dir) / "weights", device=device, timeout=min(cfg.timeout, 120.0)
    )
    return RemoteEngine(
        cfg.url, api=cfg.api, sync=sync, timeout=cfg.timeout, retries=cfg.retries, backoff=cfg.retry_backoff,
        lora_sync=cfg.lora_sync,
    )  # fmt: skip


__all__ = [
    "CollectiveWeightSync",
    "EngineClient",
    "EngineError",
    "EngineOutput",
    "FileWeightSync",
    "InProcessEngine",
    "RemoteEngine",
    "RolloutEngine",
    "StaleSampleError",
    "WarnOnce",
    "WeightFileError",
    "WeightSync",
    "build_engine",
    "check_staleness",
    "load_weights",
    "prepare_engine",
    "run_calls",
    "save_weights",
    "split_calls",
]
