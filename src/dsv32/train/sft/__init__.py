"""Supervised fine-tuning on conversations (``dsv32 sft``): the loss only on the assistant's tokens.

- :mod:`~dsv32.train.sft.config` — :class:`SFTConfig` and its sections (TOML recipes, overrides);
- :mod:`~dsv32.train.sft.data` — conversations → examples with loss masks, rows (padded or packed);
- :mod:`~dsv32.train.sft.model` — :func:`prepare_sft_model`: a model with the V3.2 tokens, saved with
  the V3.2 chat template;
- :mod:`~dsv32.train.sft.trainer` — :func:`train_sft`: the loop, with checkpoints, exact resume, JSONL
  metrics and a loss plot (:mod:`~dsv32.train.sft.plot`).
"""

from dsv32.train.sft.config import (
    SFTConfig,
    SFTConfigError,
    SFTDataConfig,
    SFTModelConfig,
    SFTTrainConfig,
    load_sft_config,
    sft_config_from_dict,
)
from dsv32.train.sft.model import SFTModel, SFTModelError, prepare_sft_model, save_sft_model
from dsv32.train.sft.trainer import SFTResult, eval_loss, loss_sum, run_identity, train_sft

__all__ = [
    "SFTConfig",
    "SFTConfigError",
    "SFTDataConfig",
    "SFTModel",
    "SFTModelConfig",
    "SFTModelError",
    "SFTResult",
    "SFTTrainConfig",
    "eval_loss",
    "load_sft_config",
    "loss_sum",
    "prepare_sft_model",
    "run_identity",
    "save_sft_model",
    "sft_config_from_dict",
    "train_sft",
]
