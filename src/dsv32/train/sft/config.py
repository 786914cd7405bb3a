"""The ``dsv32 sft`` recipe: ``[model]``, ``[data]``, ``[train]``, ``out_dir`` and ``report_to``, every
field type- and range-checked (:mod:`dsv32.recipe`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from dsv32.engine.lora import LoRAConfig
from dsv32.recipe import (
    BETAS,
    EXISTING_PATH,
    NON_NEGATIVE,
    OUT_DIR,
    POSITIVE,
    Checked,
    RecipeError,
    Rule,
    at_least,
    build_section,
    check_fields,
    check_sections,
    in_range,
    one_of,
    read_recipe,
)
from dsv32.trackers import REPORT_TO


class SFTConfigError(RecipeError):
    """A recipe or override that does not fit the SFT config schema."""


@dataclass
class SFTModelConfig(Checked, error=SFTConfigError):
    """``name``: ``smollm2``, a Hugging Face model directory or a native V3.2 checkpoint (with its
    tokenizer). ``dtype``: what the forward computes in — ``"float32"``, ``"bfloat16"`` (mixed
    precision: autocast over fp32 weights; gradients, optimizer state and the loss fp32) or
    ``"auto"`` (bf16 where the device has native bf16)."""

    RANGES: ClassVar[dict[str, Rule]] = {"dtype": one_of("float32", "bfloat16", "auto")}

    name: str = "smollm2"
    device: str = "auto"
    dtype: str = "float32"


@dataclass
class SFTDataConfig(Checked, error=SFTConfigError):
    """``path``: JSONL conversations; ``eval_path``: held-out ones for an eval loss ("" = none);
    ``seq_len``: the longest row; ``packing``: whole conversations best-fit into rows (HF models);
    ``thinking_mode``: ``thinking`` or ``chat``; ``train_on``: ``all`` assistant turns, the
    ``last_round``, or ``each_round`` (one example per round, with its reasoning); ``overlong``: ``drop``, ``truncate`` or ``error`` for conversations over seq_len."""

    RANGES: ClassVar[dict[str, Rule]] = {
        "path": EXISTING_PATH,
        "eval_path": Rule(lambda v: v == "" or Path(v).exists(), "'' or an existing file", on_disk=True),
        "seq_len": at_least(8),
        "thinking_mode": one_of("thinking", "chat"),
        "train_on": one_of("all", "last_round", "each_round"),
        "overlong": one_of("drop", "truncate", "error"),
    }

    path: str = "runs/posttrain/coldstart.jsonl"
    eval_path: str = ""
    seq_len: int = 1024
    packing: bool = False
    thinking_mode: str = "thinking"
    train_on: str = "all"
    overlong: str = "drop"


@dataclass
class SFTTrainConfig(Checked, error=SFTConfigError):
    """Optimization. ``steps`` 0: ``ceil(epochs × rows / (batch_size × grad_accum))``."""

    RANGES: ClassVar[dict[str, Rule]] = {
        "epochs": POSITIVE,
        "steps": NON_NEGATIVE,
        "batch_size": at_least(1),
        "grad_accum": at_least(1),
        "lr": POSITIVE,
        "weight_decay": NON_NEGATIVE,
        "betas": BETAS,
        "warmup_steps": NON_NEGATIVE,
        "min_lr_ratio": in_range(0.0, 1.0),
        "clip_grad": NON_NEGATIVE,
        "save_every": NON_NEGATIVE,
        "log_every": at_least(1),
        "eval_every": NON_NEGATIVE,
        "keep_checkpoints": at_least(1),
        "freeze_layers": NON_NEGATIVE,
        "new_token_lr": NON_NEGATIVE,
    }

    epochs: float = 3.0
    steps: int = 0
    batch_size: int = 4
    grad_accum: int = 1
    lr: float = 2e-5
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    clip_grad: float = 1.0
    seed: int = 0
    save_every: int = 0
    log_every: int = 1
    eval_every: int = 0
    keep_checkpoints: int = 2
    freeze_layers: int = 0  # the lowest N transformer layers keep their weights (a CPU budget)
    #: > 0: the embedding matrix (and an untied head) is its own optimizer group at this lr, and only the
    #: rows of the V3.2 tokens this run added move (the other rows keep their values); 0, or no tokens
    #: added (a tokenizer that has them already): every row trains with the rest at ``lr``.
    new_token_lr: float = 0.0

    @property
    def rows_per_step(self) -> int:
        return self.batch_size * self.grad_accum


@dataclass
class SFTConfig:
    model: SFTModelConfig = field(default_factory=SFTModelConfig)
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    train: SFTTrainConfig = field(default_factory=SFTTrainConfig)
    #: a LoRA adapter instead of the full weights (off by default; docs/training.md)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    out_dir: str = "runs/sft"
    #: experiment trackers: "none" or a comma-separated list of tensorboard, wandb, mlflow, trackio
    report_to: str = "none"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class _TopLevel(Checked, error=SFTConfigError):
    RANGES: ClassVar[dict[str, Rule]] = {"out_dir": OUT_DIR, "report_to": REPORT_TO}
    out_dir: str = "runs/sft"
    report_to: str = "none"


_SECTIONS = {"model": SFTModelConfig, "data": SFTDataConfig, "train": SFTTrainConfig, "lora": LoRAConfig}
_TOP_KEYS = ("out_dir", "report_to")


def sft_config_from_dict(data: dict[str, Any], where: str = "") -> SFTConfig:
    """Nested dicts (TOML) → :class:`SFTConfig`, every field checked (:mod:`dsv32.recipe`); ``where``:
    the table that holds it when another recipe embeds it (``sft`` of the post-training recipe)."""
    check_sections(data, [*_SECTIONS, *_TOP_KEYS], SFTConfigError, where)
    base = SFTConfig().to_dict()
    kwargs = {}
    for name, cls in _SECTIONS.items():
        given = data.get(name, {})
        if not isinstance(given, dict):
            raise SFTConfigError(f"[{name}] must be a table")
        kwargs[name] = build_section(cls, {**base[name], **given}, name, error=SFTConfigError)
    top = check_fields(_TopLevel, {k: data.get(k, base[k]) for k in _TOP_KEYS}, "top level", SFTConfigError)
    return SFTConfig(**kwargs, **top)


def load_sft_config(path: str | Path | None = None, overrides: list[str] | None = None) -> SFTConfig:
    """A TOML recipe (defaults when ``path`` is None) with ``section.field=value`` overrides."""
    return sft_config_from_dict(read_recipe(path, overrides, error=SFTConfigError))
