"""The GRPO recipe as plain dataclasses, read from TOML (``configs/rl-*.toml``) with
``section.field=value`` overrides. Field names follow the paper (§3.1) where it names the thing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from dsv32.engine.lora import LoRAConfig
from dsv32.recipe import (
    BETAS,
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
    each,
    one_of,
    read_recipe,
)
from dsv32.rl.grpo.rollout import SamplingConfig
from dsv32.trackers import REPORT_TO


class RLConfigError(RecipeError):
    """A recipe or override that does not fit the RL config schema."""


@dataclass
class PolicyConfig(Checked, error=RLConfigError):
    """``name``: ``"smollm2"``, ``"tiny-llama"``, ``"tiny-native"``, an HF model dir, or a native V3.2
    checkpoint. ``thinking``: V3.2-format prompts in thinking mode (native models that speak it).
    ``dtype``: what the training forwards (the update's, the reference's, a recomputed π_old)
    compute in: ``"float32"``, ``"bfloat16"`` (mixed precision: autocast over fp32 weights, fp32
    gradients and optimizer state, log-probs from fp32 logits) or ``"auto"`` (bf16 where the device
    has native bf16). What the rollouts sample in is ``[engine] dtype``."""

    RANGES: ClassVar[dict[str, Rule]] = {"dtype": one_of("float32", "bfloat16", "auto")}

    name: str = "smollm2"
    device: str = "auto"
    thinking: bool = False
    dtype: str = "float32"


@dataclass
class GRPOConfig(Checked, error=RLConfigError):
    """The objective (Eq. 5/8) and its stability tricks.

    - ``group_size`` G samples per prompt; ``prompts_per_step`` prompts per rollout batch;
    - ``mini_batches`` updates per rollout batch (the batch is split; > 1 is the off-policy regime that
      the tricks exist for) and ``epochs`` passes over it; ``micro_batch`` rows per forward;
    - ``clip_eps`` ε; ``kl_coef`` β (default for every domain) and ``domain_kl_coef`` per domain (the
      paper keeps KL weak or off for math); ``kl_estimator``: ``"unbiased"`` (Eq. 7) or ``"k3"``;
    - ``opsm_delta`` δ of the Off-Policy Sequence Mask (Eq. 9), None = off;
    - ``keep_sampling_mask`` renormalize π_θ / π_ref over the sampled kept sets; ``keep_routing``
      replay the rollout's MoE routing (native model); ``keep_indexing`` replay the indexer's
      selections (a model with DSA in sparse mode; Keep Indexing, :mod:`dsv32.dsa.keep`);
    - ``indexer_loss``: train the DSA indexer on the rollout batch by its KL loss (Eq. 4 over the
      selected set, as in the sparse stage; paper §3) at ``indexer_lr``; False freezes it. Both
      switches apply only to a model with DSA in sparse mode;
    - ``old_logprobs``: π_old of the ratio — ``"sampling"`` (the engine's log-probs, as in Eq. 9; no
      extra forward) or ``"recompute"`` (a no-grad training-side forward before the updates);
    - ``advantage_scale``: ``"none"`` (the paper: R − mean) or ``"std"`` (original GRPO);
    - ``max_skipped_updates``: an optimizer step whose loss or gradient norm is NaN/inf is skipped;
      this many skipped in a row stop the run (``NonFiniteUpdateError``).
    """

    RANGES: ClassVar[dict[str, Rule]] = {
        "steps": at_least(1),
        "prompts_per_step": at_least(1),
        "group_size": at_least(2),  # advantages are relative to the group
        "mini_batches": at_least(1),
        "epochs": at_least(1),
        "micro_batch": at_least(1),
        "lr": POSITIVE,
        "weight_decay": NON_NEGATIVE,
        "betas": BETAS,
        "warmup_steps": NON_NEGATIVE,
        "clip_grad": POSITIVE,
        "clip_eps": Rule(lambda v: 0 < v < 1, "in (0, 1)"),
        "kl_coef": NON_NEGATIVE,
        "domain_kl_coef": each(NON_NEGATIVE),
        "kl_estimator": one_of("unbiased", "k3"),
        "opsm_delta": NON_NEGATIVE,
        "old_logprobs": one_of("sampling", "recompute"),
        "advantage_scale": one_of("none", "std"),
        "max_skipped_updates": at_least(1),
        "indexer_lr": POSITIVE,
    }

    steps: int = 100
    prompts_per_step: int = 8
    group_size: int = 8
    mini_batches: int = 2
    epochs: int = 1
    micro_batch: int = 16
    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    warmup_steps: int = 0
    clip_grad: float = 1.0
    clip_eps: float = 0.2
    kl_coef: float = 0.0
    domain_kl_coef: dict[str, float] = field(default_factory=dict)
    kl_estimator: str = "unbiased"
    opsm_delta: float | None = None
    keep_sampling_mask: bool = True
    keep_routing: bool = True
    keep_indexing: bool = True
    indexer_loss: bool = True
    indexer_lr: float = 7.3e-6  # the sparse stage's (paper §2.1.1)
    old_logprobs: str = "sampling"
    advantage_scale: str = "none"
    max_skipped_updates: int = 3

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.prompts_per_step * self.group_size) % self.mini_batches:
            raise RLConfigError(
                f"prompts_per_step × group_size = {self.prompts_per_step * self.group_size} is not divisible "
                f"by mini_batches = {self.mini_batches}"
            )


@dataclass
class SourceConfig(Checked, error=RLConfigError):
    """One prompt source: ``kind`` ``"arithmetic"`` (procedural word problems) or ``"jsonl"``
    (``path``); ``weight`` in the mix; arithmetic options ``kinds``, ``max_operand`` and ``template``
    (``"paper"``: the paper's math prompt; ``"brief"``: short answers, one-example system prompt)."""

    RANGES: ClassVar[dict[str, Rule]] = {
        "kind": one_of("arithmetic", "jsonl"),
        "weight": POSITIVE,
        "max_operand": at_least(1),
        "template": one_of("paper", "brief"),
    }

    kind: str = "arithmetic"
    weight: float = 1.0
    path: str = ""
    domain: str = ""
    kinds: list[str] = field(default_factory=lambda: ["add", "sub", "mul", "two_step"])
    max_operand: int = 20
    template: str = "paper"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kind == "jsonl" and not Path(self.path).is_file():
            raise RLConfigError(f"path = {self.path!r}: a jsonl source needs an existing JSONL file")


@dataclass
class EvalConfig(Checked, error=RLConfigError):
    """Held-out accuracy (greedy) on ``problems`` arithmetic eval-split problems, before training,
    every ``every`` steps (0: only at the end) and after."""

    RANGES: ClassVar[dict[str, Rule]] = {
        "problems": NON_NEGATIVE,
        "every": NON_NEGATIVE,
        "max_new_tokens": at_least(1),
        "batch_size": at_least(1),
    }

    problems: int = 64
    every: int = 0
    max_new_tokens: int = 256
    batch_size: int = 32


@dataclass
class EngineConfig(Checked, error=RLConfigError):
    """Where rollouts are sampled (docs/rl.md, "Scaling out").

    - ``kind``: ``"in_process"`` (the trainer's own model, the reference) or ``"remote"`` (an HTTP
      engine at ``url``: ``dsv32 serve --enable-rl-routes`` or vLLM, speaking ``/inference/v1/generate``);
    - ``api``: ``"dsv32"`` (one batched request per turn, bit-identical to in-process sampling) or
      ``"vllm"`` (one request per row, seeded per row);
    - ``sync``: how weights reach a remote engine before each rollout: ``"file"`` (safetensors under
      ``sync_dir``, default ``<out_dir>/weights``, which the engine must be able to read), ``"collective"``
      (a torch.distributed broadcast: NCCL for weights on CUDA, gloo on CPUs) or ``"nccl"`` (the same, on CUDA);
    - ``timeout``: seconds an engine request may take before it is an error;
    - ``max_off_policy_steps``: how many weight versions a sample may lag the trainer's (0: every
      sample must come from the weights being trained; more: stale samples are kept, their staleness
      logged, and the Off-Policy Sequence Mask, ``grpo.opsm_delta``, guards them);
    - ``retries``: how many more times a request to a remote engine is sent when it could not reach
      the engine or got a 5xx (never a 4xx, a time-out or a version mismatch; 0: none), each retry
      counted in the step's ``engine_retries``; ``retry_backoff``: seconds before the first, doubling;
    - ``lora_sync``: with ``[lora]``, what a remote engine gets: ``"adapter"`` (the adapter alone, by
      file: ``dsv32 serve``'s ``/update_adapter``, vLLM's ``/v1/load_lora_adapter``), ``"merged"``
      (the merged weights through ``sync``), ``"auto"`` (the adapter when ``sync = "file"``, else
      merged);
    - ``dtype``: what the in-process engine samples in: ``"float32"`` (the trainer's model itself),
      ``"bfloat16"`` (a bf16 copy, refreshed from the trainer's weights before every rollout batch;
      log-probs and kept sets in fp32 from its logits) or ``"auto"`` (bf16 where the device has
      native bf16). A remote engine samples in the dtype it was started with (``dsv32 serve --dtype``).
    """

    RANGES: ClassVar[dict[str, Rule]] = {
        "kind": one_of("in_process", "remote"),
        "api": one_of("dsv32", "vllm"),
        "sync": one_of("file", "collective", "nccl"),
        "timeout": POSITIVE,
        "max_off_policy_steps": NON_NEGATIVE,
        "retries": NON_NEGATIVE,
        "retry_backoff": NON_NEGATIVE,
        "lora_sync": one_of("auto", "adapter", "merged"),
        "dtype": one_of("float32", "bfloat16", "auto"),
    }

    kind: str = "in_process"
    url: str = ""
    api: str = "dsv32"
    sync: str = "file"
    sync_dir: str = ""
    timeout: float = 600.0
    max_off_policy_steps: int = 0
    retries: int = 0
    retry_backoff: float = 1.0
    lora_sync: str = "auto"
    dtype: str = "float32"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lora_sync == "adapter" and self.sync != "file":
            raise RLConfigError(
                '[engine] lora_sync = "adapter" sends the adapter by file: it needs sync = "file"'
            )
        if self.kind == "remote" and not self.url:
            raise RLConfigError('[engine] kind = "remote" needs url (the engine\'s base URL)')
        if self.kind == "remote" and self.dtype != "float32":
            raise RLConfigError(
                f'[engine] dtype = "{self.dtype}" is the in-process engine\'s; a remote engine samples in '
                "the dtype it was started with (dsv32 serve --dtype)"
            )


@dataclass
class RayConfig(Checked, error=RLConfigError):
    """Ray for fanning out environment episodes (docs/rl.md, "Scaling out"). ``address`` ``""``: no
    Ray, episodes run in threads of the trainer (the default); ``"local"``: a Ray cluster started on
    this machine with ``num_cpus`` CPUs (0: all); ``"ray://host:port"``: an existing cluster.
    ``actors`` episode actors, each reserving ``cpus_per_actor`` (fractions allowed);
    ``placement_timeout``: seconds the actors may take to be placed before it is an error;
    ``episode_timeout``: seconds one episode's result may take."""

    RANGES: ClassVar[dict[str, Rule]] = {
        "address": Rule(
            lambda v: v in ("", "local") or str(v).startswith("ray://"), "'', 'local' or 'ray://host:port'"
        ),
        "num_cpus": NON_NEGATIVE,
        "actors": at_least(1),
        "cpus_per_actor": POSITIVE,
        "placement_timeout": POSITIVE,
        "episode_timeout": POSITIVE,
    }

    address: str = ""
    num_cpus: int = 0
    actors: int = 4
    cpus_per_actor: float = 0.5
    placement_timeout: float = 10.0
    episode_timeout: float = 900.0


@dataclass
class RLConfig:
    """The recipe. ``lora``: train a LoRA adapter instead of the full weights (off by default; docs/rl.md,
    "LoRA"). ``save_every``: a checkpoint every N steps (0: only at the end); ``log_every``: a
    ``metrics.jsonl`` row every N steps (and at the last, and for a step with a skipped update)."""

    policy: PolicyConfig = field(default_factory=PolicyConfig)
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(temperature=1.0, top_p=0.95))
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    sources: list[SourceConfig] = field(default_factory=lambda: [SourceConfig()])
    rewards: dict[str, dict[str, Any]] = field(default_factory=dict)
    eval: EvalConfig = field(default_factory=EvalConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    out_dir: str = "runs/rl"
    seed: int = 0
    save_every: int = 0
    log_every: int = 1
    #: experiment trackers: "none" or a comma-separated list of tensorboard, wandb, mlflow, trackio
    report_to: str = "none"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_SECTIONS = {
    "policy": PolicyConfig,
    "sampling": SamplingConfig,
    "grpo": GRPOConfig,
    "eval": EvalConfig,
    "engine": EngineConfig,
    "ray": RayConfig,
    "lora": LoRAConfig,
}
_SCALARS = ("out_dir", "seed", "save_every", "log_every", "report_to")
TOP_KEYS = (*_SCALARS, "sources", "rewards")  # beside the sections


@dataclass
class _TopLevel(Checked, error=RLConfigError):
    """The recipe's top-level keys (checked like a section)."""

    RANGES: ClassVar[dict[str, Rule]] = {
        "out_dir": OUT_DIR,
        "save_every": NON_NEGATIVE,
        "log_every": at_least(1),
        "report_to": REPORT_TO,
    }

    out_dir: str = "runs/rl"
    seed: int = 0
    save_every: int = 0
    log_every: int = 1
    report_to: str = "none"


def _build(cls, data: Any, where: str):
    return build_section(cls, data, where, error=RLConfigError)


def rl_config_from_dict(data: dict[str, Any], extra: tuple[str, ...] = (), where: str = "") -> RLConfig:
    """Nested dicts (TOML) → :class:`RLConfig`; missing sections and fields keep their defaults; every
    field is checked (:mod:`dsv32.recipe`). ``extra``: sections a recipe that embeds this one also
    accepts (named, with ``where``, in the message about an unknown section)."""
    base = RLConfig().to_dict()
    check_sections(data, [*_SECTIONS, *TOP_KEYS, *extra], RLConfigError, where)
    kwargs: dict[str, Any] = {}
    for name, cls in _SECTIONS.items():
        given = data.get(name, {})
        if not isinstance(given, dict):
            raise RLConfigError(f"[{name}] must be a table")
        kwargs[name] = _build(cls, {**base[name], **given}, name)
    if kwargs["sampling"].temperature <= 0:
        raise RLConfigError(
            f"[sampling] temperature = {kwargs['sampling'].temperature}: must be > 0 for RL (the policy's "
            "log-probs are taken at this temperature, and GRPO needs varied samples); the held-out "
            "evaluation is greedy on its own"
        )
    sources = data.get("sources", base["sources"])
    if not isinstance(sources, list) or not sources:
        raise RLConfigError("sources must be a non-empty array of tables ([[sources]])")
    kwargs["sources"] = [_build(SourceConfig, s, f"sources.{i}") for i, s in enumerate(sources)]
    rewards = data.get("rewards", {})
    if not isinstance(rewards, dict) or not all(isinstance(v, dict) for v in rewards.values()):
        raise RLConfigError("[rewards] must be a table of per-domain tables")
    scalars = {k: data[k] for k in _SCALARS if k in data}
    kwargs |= check_fields(
        _TopLevel, {**dataclasses.asdict(_TopLevel()), **scalars}, "top level", RLConfigError
    )
    return RLConfig(**kwargs, rewards=rewards)


def load_rl_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RLConfig:
    """Read a TOML recipe (defaults when ``path`` is None) and apply ``section.field=value`` overrides."""
    return rl_config_from_dict(read_recipe(path, overrides, error=RLConfigError))
