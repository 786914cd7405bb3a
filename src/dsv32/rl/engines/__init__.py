"""Rollout engines behind one interface (:class:`RolloutEngine`): the in-process engine (the
reference) and a remote engine over HTTP (``dsv32 serve`` or vLLM), with the weight sync beside
them. See docs/rl.md, "Scaling out"."""

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
from dsv32.rl.engines.in_process import InProcessEngine
from dsv32.rl.engines.remote import RemoteEngine
from dsv32.rl.engines.weight_sync import CollectiveWeightSync, FileWeightSync, weight_sync


def build_engine(cfg, model, out_dir: str | Path) -> RolloutEngine:
    """The engine of a recipe's ``[engine]`` section (:class:`~dsv32.rl.grpo.config.EngineConfig`);
    ``model`` is the trainer's (the in-process engine samples with it)."""
    if cfg.kind == "in_process":
        return InProcessEngine(model)
    device = next(model.parameters()).device if isinstance(model, torch.nn.Module) else "cpu"
    sync = weight_sync(
        cfg.sync, cfg.sync_dir or Path(out_dir) / "weights", device=device, timeout=min(cfg.timeout, 120.0)
    )
    return RemoteEngine(cfg.url, api=cfg.api, sync=sync, timeout=cfg.timeout)


__all__ = [
    "CollectiveWeightSync",
    "EngineError",
    "EngineOutput",
    "FileWeightSync",
    "InProcessEngine",
    "RemoteEngine",
    "RolloutEngine",
    "StaleSampleError",
    "WarnOnce",
    "WeightFileError",
    "build_engine",
    "check_staleness",
    "load_weights",
    "prepare_engine",
    "run_calls",
    "save_weights",
    "split_calls",
]
