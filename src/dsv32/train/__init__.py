"""Training: DSA continued pre-training of any supported model (paper §2.1.1).

- :mod:`~dsv32.train.config` — :class:`RunConfig` and its sections (TOML recipes, CLI overrides);
- :mod:`~dsv32.train.data` — documents → packed token sequences with a held-out split;
- :mod:`~dsv32.train.models` — :func:`load_dsa_model` and :class:`DSAModel` (HF + DSA, or native V3.2);
- :mod:`~dsv32.train.trainer` — :func:`train_stage`: dense warm-up (Eq. 3) and sparse training
  (LM + Eq. 4), with checkpoints, exact resume, JSONL metrics and a loss plot;
- :mod:`~dsv32.train.pipeline` — what ``dsv32 dsa …`` and ``dsv32 demo`` run: load → data → stage(s) →
  evaluation (:mod:`~dsv32.train.evaluate`, :mod:`~dsv32.train.report`);
- :mod:`~dsv32.train.sft` — supervised fine-tuning on conversations (``dsv32 sft``).
"""

from dsv32.runlog import read_metrics
from dsv32.train.config import (
    DataConfig,
    EvalConfig,
    ModelSpec,
    RunConfig,
    StageConfig,
    TrainConfigError,
    load_run_config,
)
from dsv32.train.data import TokenData, load_token_data
from dsv32.train.models import DSAModel, load_dsa_model
from dsv32.train.trainer import StageResult, train_stage

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
    "read_metrics",
    "train_stage",
]
