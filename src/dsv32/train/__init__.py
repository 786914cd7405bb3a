"""LM training, one package per trainer:

- :mod:`~dsv32.train.dsa` — DSA continued pre-training of any supported model (paper §2.1.1): the
  dense warm-up (Eq. 3) and the sparse stage (LM + Eq. 4), evaluation and the report (``dsv32 dsa …``,
  ``dsv32 demo``); its public names are re-exported here;
- :mod:`~dsv32.train.sft` — supervised fine-tuning on conversations (``dsv32 sft``).
"""

from dsv32.runlog import read_metrics
from dsv32.train.dsa import (
    DataConfig,
    DSAModel,
    EvalConfig,
    ModelSpec,
    RunConfig,
    StageConfig,
    StageResult,
    TokenData,
    TrainConfigError,
    load_dsa_model,
    load_run_config,
    load_token_data,
    train_stage,
)

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
