"""DSA continued pre-training of any supported model (paper §2.1.1).

- :mod:`~dsv32.train.dsa.config` — :class:`RunConfig` and its sections (TOML recipes, CLI overrides);
- :mod:`~dsv32.train.dsa.data` — documents → packed token sequences with a held-out split;
- :mod:`~dsv32.train.dsa.models` — :func:`load_dsa_model` and :class:`DSAModel` (HF + DSA, or native
  V3.2);
- :mod:`~dsv32.train.dsa.trainer` — :func:`train_stage`: dense warm-up (Eq. 3) and sparse training
  (LM + Eq. 4), with checkpoints, exact resume, JSONL metrics and a loss plot
  (:mod:`~dsv32.train.dsa.plot`);
- :mod:`~dsv32.train.dsa.pipeline` — what ``dsv32 dsa …`` and ``dsv32 demo`` run: load → data →
  stage(s) → evaluation (:mod:`~dsv32.train.dsa.evaluate`, :mod:`~dsv32.train.dsa.report`).
"""

from dsv32.train.dsa.config import (
    DataConfig,
    EvalConfig,
    ModelSpec,
    RunConfig,
    StageConfig,
    TrainConfigError,
    load_run_config,
)
from dsv32.train.dsa.data import TokenData, load_token_data
from dsv32.train.dsa.models import DSAModel, load_dsa_model
from dsv32.train.dsa.trainer import StageResult, train_stage

__all__ = [
    "DSAModel",
    "DataConfig",
    "EvalConfig",
    "ModelSpec",
    "RunConfig",
    "StageConfig",
    "StageResult",
    "TokenData",
    "TrainConfigError",
    "load_dsa_model",
    "load_run_config",
    "load_token_data",
    "train_stage",
]
