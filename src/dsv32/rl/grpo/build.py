"""The parts a GRPO trainer is built from, each a function of the recipe: the reference model, the
sampling replica and FSDP2 sharding, the optimizer, the warm-up schedule, the noise of a step, the
run's identity for resuming, and the checks of a ``torchrun`` world.

Exact resume rests on :func:`step_generator`: everything random in step ``s`` draws from generators
seeded by ``(seed, s, stream, …)``, never from global state, so a resumed run and a run on another
number of processes sample what an uninterrupted one-process run samples.
"""

from __future__ import annotations

import copy
import dataclasses
import json

import torch

from dsv32 import distributed
from dsv32.engine.lora import LoRAConfig, apply_lora, has_adapter
from dsv32.rl.grpo.config import GRPOConfig, RLConfig
from dsv32.rl.grpo.indexing import is_indexer_parameter, sparse_dsa
from dsv32.rl.grpo.policy import Policy
from dsv32.runlog import file_digest

#: The streams of :func:`step_generator`: a step's group sampling, its mini-batch order, and the
#: single-turn prompts of a mixed agentic step (episodes use :data:`SAMPLES`).
SAMPLES, UPDATES, MIXED_PROMPTS = 1, 2, 3


def step_generator(seed: int, *parts: int) -> torch.Generator:
    """A CPU generator seeded by ``seed`` and ``parts`` (e.g. ``step, SAMPLES, item``)."""
    g = torch.Generator()
    value = seed
    for p in parts:
        value = (value * 1_000_003 + p) % (2**63 - 1)
    return g.manual_seed(value)


def lr_factor(step: int, g: GRPOConfig) -> float:
    """The linear warm-up of the learning rate over ``warmup_steps`` (1 after it)."""
    return min(1.0, (step + 1) / g.warmup_steps) if g.warmup_steps else 1.0


def trained_grpo(g: GRPOConfig, policy: Policy) -> GRPOConfig:
    """``g`` as it applies to ``policy``: Keep Routing off for a dense model (no routing to keep),
    Keep Indexing and the indexer loss off for a model without DSA in sparse mode (no selection),
    the indexer loss off for a policy that trains a LoRA adapter (the base model, indexer included,
    stays frozen)."""
    if g.keep_routing and policy.kind != "native":
        g = dataclasses.replace(g, keep_routing=False)
    if (g.keep_indexing or g.indexer_loss) and not sparse_dsa(policy.model):
        g = dataclasses.replace(g, keep_indexing=False, indexer_loss=False)
    if g.indexer_loss and has_adapter(policy.model):
        g = dataclasses.replace(g, indexer_loss=False)
    return g


def adapt_policy(policy: Policy, cfg: LoRAConfig, seed: int) -> bool:
    """``[lora]`` applied to ``policy``'s model in place (:func:`dsv32.engine.lora.apply_lora`: only
    the adapter trains), its initial weights a function of ``seed`` alone; True when it was (False:
    ``cfg`` is off, full fine-tuning)."""
    if not cfg.enabled:
        return False
    apply_lora(policy.model, cfg, seed=seed)
    return True


def reference_policy(policy: Policy, g: GRPOConfig) -> Policy | None:
    """A frozen copy of ``policy`` for the KL term; None when no domain has a KL coefficient. A
    policy that trains a LoRA adapter needs no copy: its reference is the same model with the
    adapter switched off (``base_only``), which is the base model exactly."""
    if not (g.kl_coef > 0 or any(v > 0 for v in g.domain_kl_coef.values())):
        return None
    if has_adapter(policy.model):
        return dataclasses.replace(policy, base_only=True)
    frozen = copy.deepcopy(policy.model).eval().requires_grad_(False)
    return Policy(frozen, policy.tokenizer, policy.kind, policy.thinking, autocast=policy.autocast)


def make_optimizer(policy: Policy, g: GRPOConfig) -> torch.optim.AdamW:
    """AdamW over the policy, with weight decay on its matrices only. With ``indexer_loss`` the DSA
    indexer's parameters are groups of their own (``side = "indexer"``) at ``indexer_lr``."""
    named = list(policy.model.named_parameters())
    if has_adapter(policy.model):  # LoRA: the adapter alone
        named = [(n, p) for n, p in named if p.requires_grad]
    index = {id(p) for n, p in named if g.indexer_loss and is_indexer_parameter(n)}
    params = [p for _, p in named if id(p) not in index]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": g.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    if index:
        indexer = [p for _, p in named if id(p) in index]
        groups += [
            {"params": [p for p in indexer if p.dim() >= 2], "weight_decay": g.weight_decay},
            {"params": [p for p in indexer if p.dim() < 2], "weight_decay": 0.0},
        ]
        for group in groups[2:]:
            group |= {"side": "indexer", "lr": g.indexer_lr}
    return torch.optim.AdamW(groups, lr=g.lr, betas=tuple(g.betas))


def sampling_replica(policy: Policy) -> Policy:
    """What the rollouts sample with: ``policy`` itself in one process; under ``torchrun`` a plain
    copy of its model (taken before it is sharded) that :func:`refresh_replica` refreshes from the
    sharded policy (sampling runs different numbers of forwards on different ranks, which FSDP
    cannot)."""
    if not distributed.world().active:
        return policy
    replica = copy.deepcopy(policy.model).eval().requires_grad_(False)
    return Policy(replica, policy.tokenizer, policy.kind, policy.thinking, autocast=policy.autocast)


def shard_for_training(policy: Policy, ref: Policy | None) -> Policy:
    """The sampling replica of ``policy`` (:func:`sampling_replica`, taken while it is whole), then
    ``ref`` and ``policy`` sharded with FSDP2 (nothing in one process); returns the replica."""
    sampler = sampling_replica(policy)
    if ref is not None and ref.model is not policy.model:
        distributed.shard_model(ref.model)
    distributed.shard_model(policy.model)
    return sampler


def refresh_replica(policy: Policy, sampler: Policy) -> None:
    """The sharded ``policy``'s current weights copied into its sampling replica ``sampler`` (nothing
    when the policy samples itself)."""
    if sampler is not policy:
        distributed.copy_full_parameters(policy.model, sampler.model)


def check_world(cfg: RLConfig, w: distributed.World) -> None:
    """:class:`~dsv32.distributed.DistError` when a GRPO recipe cannot run over ``w``'s processes:
    the step's groups must split evenly, and the rollouts run in process."""
    if not w.active:
        return
    if cfg.lora.enabled:
        raise distributed.DistError("[lora] runs in one process: start it without torchrun")
    n = cfg.grpo.prompts_per_step
    if n % w.size:
        raise distributed.DistError(
            f"grpo.prompts_per_step={n} does not split over {w.size} processes by whole groups: "
            f"make it a multiple of {w.size}"
        )
    if cfg.engine.kind != "in_process":
        raise distributed.DistError(
            f"[engine] kind={cfg.engine.kind!r}: on several processes GRPO samples in process "
            "(kind='in_process'); a remote engine serves one trainer process"
        )


#: Fields that do not change what is trained: they may differ when a run is resumed (``grpo.steps``
#: may grow; it is checked on its own). ``""``: the top level.
BOOKKEEPING = {
    "": ("out_dir", "save_every", "log_every", "report_to"),
    "policy": ("device",),
    "grpo": ("steps", "max_skipped_updates"),
    "eval": ("every", "batch_size"),
    "engine": ("kind", "url", "api", "sync", "sync_dir", "timeout", "lora_sync"),
    "ray": ("address", "num_cpus", "actors", "cpus_per_actor", "placement_timeout", "episode_timeout"),
}


def task_files(cfg: RLConfig) -> dict[tuple[str, int], str]:
    """The task files of a recipe's ``[[sources]]``: ``(section, index) → path``."""
    return {("sources", i): s.path for i, s in enumerate(cfg.sources) if s.kind == "jsonl" and s.path}


def run_identity(config: dict, files: dict[tuple[str, int], str]) -> dict:
    """What determines a GRPO run: the recipe ``config`` (``RLConfig.to_dict``, or a recipe that
    extends it) without :data:`BOOKKEEPING`, and the SHA-256 of each task file in ``files`` as
    ``<section>.<index>.sha256``."""
    identity = json.loads(json.dumps(config))
    if not identity.get("lora", {}).get("enabled", True):
        identity.pop("lora")  # off: the identity of a run from before [lora] existed
    if identity.get("engine", {}).get("dtype") == "float32":
        identity["engine"].pop("dtype")  # likewise for runs from before [engine] dtype
    for section, fields in BOOKKEEPING.items():
        table = identity.get(section, {}) if section else identity
        for f in fields:
            table.pop(f, None)
    for (section, i), path in files.items():
        identity[section][i]["sha256"] = file_digest(path)
    return identity
