"""The GRPO loop (paper §3.1): rollouts → rewards → group advantages → several mini-batch updates.

One step:

1. draw ``prompts_per_step`` tasks from the domain mix and sample ``group_size`` completions each with
   the current policy (π_old), recording sampling log-probs, kept sets and MoE routing;
2. score every completion with its domain's reward; ``A = R − mean(group)``;
3. log-probs of the frozen reference model (only when some domain has a KL coefficient);
4. split the batch into ``mini_batches`` (× ``epochs``) and take one optimizer step per mini-batch —
   from the second one on, π_θ ≠ π_old: the off-policy regime that the unbiased KL estimate, the
   Off-Policy Sequence Mask, Keep Routing and Keep Sampling Mask exist for.

Exact resume: tasks and sampling noise of step ``s`` are functions of ``(seed, s)`` — each task's
group draws from a generator of its own, seeded by ``(seed, s, its index in the step)``
(:func:`~dsv32.rl.grpo.rollout.rollout`'s ``group_generators``); a checkpoint holds the policy, the optimizer and the step.

Under ``torchrun`` (:mod:`dsv32.distributed`) rank ``r`` of ``W`` takes the ``r``-th of ``W`` equal
parts of the step's tasks (whole groups: ``prompts_per_step`` must be a multiple of ``W``) and
samples them with a full, unsharded replica of the policy's weights (copied from the FSDP-sharded
policy before each step's rollouts and each held-out evaluation: sampling runs different numbers of
forwards on different ranks, which FSDP cannot). The policy and the reference model are sharded
with FSDP2; the mini-batches are drawn over the global batch of outputs, Eq. 8's output count and
the metrics are summed over the ranks and the gradients summed, so ``W`` processes compute the
update of one. Checkpoints are DCP checkpoints; rank 0 alone writes the logs, plots and model. Outputs under ``out_dir``: ``metrics.jsonl`` (one line
per step), ``eval.jsonl`` (held-out accuracy), ``rl.png``, ``checkpoints/step_NNNNNN/``, ``model/``.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from dsv32 import distributed
from dsv32.rl.grpo.config import GRPOConfig, RLConfig, RLConfigError
from dsv32.rl.engines import InProcessEngine, RolloutEngine, build_engine, check_staleness, prepare_engine
from dsv32.rl.grpo.loss import group_advantages
from dsv32.rl.grpo.policy import Policy, load_policy
from dsv32.rl.grpo.rewards import RewardFunction
from dsv32.rl.grpo.rewards.setup import RewardSetup, build_reward_fn, judge_counts, reward_setup, score
from dsv32.rl.grpo.rollout import SamplingConfig, TurnHook, check_context, generation_budget, rollout
from dsv32.rl.grpo.tasks import ArithmeticWordProblems, JsonlTasks, MixedTasks, Task
from dsv32.rl.grpo.update import UpdateGuard, check_finite_policy, grpo_update, rl_guard
from dsv32.runlog import (
    RUN_OUTPUTS,
    append_metrics,
    file_digest,
    read_metrics,
    truncate_metrics,
    write_json,
)

logger = logging.getLogger(__name__)


@dataclass
class RLResult:
    out_dir: Path
    steps: int
    seconds: float
    metrics: list[dict] = field(default_factory=list)
    eval_before: dict | None = None
    eval_after: dict | None = None
    model_dir: Path | None = None

    def summary(self) -> str:
        lines = [f"dsv32 rl train: {self.steps} steps in {self.seconds:.0f} s → {self.out_dir}"]
        if self.eval_before and self.eval_after:
            b, a = self.eval_before, self.eval_after
            lines.append(
                f"held-out accuracy {b['accuracy']:.3f} → {a['accuracy']:.3f}, reward {b['reward']:.3f} → "
                f"{a['reward']:.3f} ({a['problems']} problems, greedy)"
            )
        if self.metrics:
            first, last = self.metrics[0], self.metrics[-1]
            lines.append(
                f"train reward {first['reward_mean']:.3f} (step 1) → {last['reward_mean']:.3f} (step {last['step']})"
            )
        return "\n".join(lines)


def build_tasks(cfg: RLConfig, rewards: RewardSetup | None = None) -> MixedTasks:
    """The recipe's ``[[sources]]`` as one mix. With ``rewards``, every task is checked as its source is
    read (before any model loads): its domain has a reward and it has the fields that reward reads."""
    check = rewards.task_problem if rewards is not None else None
    sources = []
    for i, s in enumerate(cfg.sources):
        if s.kind == "arithmetic":
            src = ArithmeticWordProblems(
                cfg.seed, s.kinds, s.max_operand, s.domain or "math", template=s.template
            )
            problem = check(src.get(0)) if check is not None else None
            if problem:
                raise RLConfigError(f"[sources.{i}] {problem}")
        elif s.kind == "jsonl":
            if not s.path:
                raise RLConfigError("a jsonl source needs a path")
            src = JsonlTasks(s.path, s.domain or "general", check=check)
        else:
            raise RLConfigError(f"unknown source kind {s.kind!r}; known: 'arithmetic', 'jsonl'")
        sources.append((src, s.weight))
    return MixedTasks(sources, seed=cfg.seed)


def eval_tasks(cfg: RLConfig) -> list[Task]:
    """The held-out problems: the eval split of the first arithmetic source."""
    for s in cfg.sources:
        if s.kind == "arithmetic":
            src = ArithmeticWordProblems(
                cfg.seed, s.kinds, s.max_operand, s.domain or "math", split="eval", template=s.template
            )
            return src.take(cfg.eval.problems)
    return []


def rewards_of(cfg: RLConfig, reward_fn: Callable | None = None) -> RewardSetup | None:
    """The recipe's ``[rewards]`` checked (:func:`reward_setup`), or the domains of a given
    :class:`RewardFunction`; None for another reward callable (its tasks are taken on trust)."""
    if reward_fn is not None:
        specs = getattr(reward_fn, "specs", None)
        return RewardSetup(dict(specs), None) if isinstance(specs, dict) else None
    return reward_setup(cfg.rewards, max_tokens=completion_budget(cfg.sampling), thinking=cfg.policy.thinking)


@torch.no_grad()
def evaluate(
    policy: Policy, tasks: list[Task], reward_fn: RewardFunction, max_new_tokens: int, batch_size: int
) -> dict:
    """Greedy accuracy (share of outcome-correct answers) and mean reward on ``tasks``. Under
    ``torchrun`` rank ``r`` evaluates batches ``r, r + W, …`` (the batches of one process) with
    ``policy`` unsharded, and every rank gets the whole result."""
    was = policy.model.training
    policy.model.eval()
    w = distributed.world()
    starts = list(range(0, len(tasks), batch_size))
    mine = []
    for a in starts[w.rank :: w.size]:
        batch = rollout(policy, tasks[a : a + batch_size], 1, greedy_config(max_new_tokens))
        scored = zip(score(reward_fn, batch), batch.completions, batch.num_tokens)
        mine.append((a, [(bool(res.correct), res.total, n, text) for res, text, n in scored]))
    policy.model.train(was)
    rows = [
        r for _, part in sorted(p for ps in distributed.all_gather_objects(mine) for p in ps) for r in part
    ]
    n = max(1, len(tasks))
    return {
        "accuracy": sum(c for c, _, _, _ in rows) / n,
        "reward": sum(r for _, r, _, _ in rows) / n,
        "mean_tokens": sum(k for _, _, k, _ in rows) / n,
        "problems": len(tasks),
        "samples": [text for _, _, _, text in rows[:3]],
    }


def greedy_config(max_new_tokens: int) -> SamplingConfig:
    return SamplingConfig(temperature=0.0, max_new_tokens=max_new_tokens, max_total_tokens=max_new_tokens)


def _generator(seed: int, *parts: int) -> torch.Generator:
    g = torch.Generator()
    value = seed
    for p in parts:
        value = (value * 1_000_003 + p) % (2**63 - 1)
    return g.manual_seed(value)


def _lr_factor(step: int, cfg: GRPOConfig) -> float:
    return min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps else 1.0


def train_grpo(
    cfg: RLConfig,
    *,
    policy: Policy | None = None,
    reward_fn: RewardFunction | None = None,
    hook: TurnHook | None = None,
    resume: bool = True,
    progress: bool = True,
    stop_after: int | None = None,
    evaluate_before: bool = True,
    on_step: Callable[[dict], None] | None = None,
) -> RLResult:
    """Run GRPO as configured. ``policy``/``reward_fn`` default to those the config names; ``hook``
    enables multi-turn rollouts (``sampling.max_turns`` > 1); ``stop_after`` interrupts after that step
    (with a checkpoint), as if the process had been killed."""
    w = distributed.setup()
    check_world(cfg, w)  # before anything loads
    out = Path(cfg.out_dir)
    torch.manual_seed(cfg.seed)
    rewards = rewards_of(cfg, reward_fn)
    tasks = build_tasks(cfg, rewards)  # every task checked before the model loads
    held_out = eval_tasks(cfg)
    policy = policy or load_policy(cfg.policy.name, thinking=cfg.policy.thinking, device=cfg.policy.device)
    reward_fn = reward_fn or build_reward_fn(
        rewards, max_tokens=completion_budget(cfg.sampling), thinking=cfg.policy.thinking
    )
    for src, _ in tasks.sources:  # every task file's prompt against the window, before step 1
        check_context(policy, getattr(src, "tasks", ()), generation_budget(cfg.sampling))
    check_context(policy, held_out, cfg.eval.max_new_tokens)
    g = cfg.grpo
    if g.keep_routing and policy.kind != "native":
        g = replace(g, keep_routing=False)  # dense models have no routing to keep
    ref = reference_policy(policy, g)
    sampler = shard_for_training(policy, ref)
    optimizer = make_optimizer(policy, g)
    guard = rl_guard(g.max_skipped_updates)

    engine = build_engine(cfg.engine, sampler.model, out)

    def evaluate(step: int, path: Path) -> dict:
        refresh_replica(policy, sampler)
        return _eval(sampler, held_out, reward_fn, cfg, step, path, progress)

    def step_fn(step: int) -> dict:
        return grpo_step(
            policy, ref, optimizer, tasks, reward_fn, cfg, g, step, hook, guard=guard, engine=engine,
            sampler=sampler,
        )  # fmt: skip

    return run_steps(
        policy,
        optimizer,
        RLResult(out, 0, 0.0),
        step_fn,
        evaluate if held_out else None,
        cfg,
        resume=resume,
        progress=progress,
        stop_after=stop_after,
        evaluate_before=evaluate_before,
        on_step=on_step,
        run=run_identity(cfg.to_dict(), task_files(cfg)),
        meta={"config.json": cfg.to_dict()},
        guard=guard,
    )


#: Fields that do not change what is trained: they may differ when a run is resumed (``grpo.steps``
#: may grow; it is checked on its own). ``""``: the top level.
BOOKKEEPING = {
    "": ("out_dir", "save_every", "log_every"),
    "policy": ("device",),
    "grpo": ("steps", "max_skipped_updates"),
    "eval": ("every", "batch_size"),
    "engine": ("kind", "url", "api", "sync", "sync_dir", "timeout"),
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
    for section, fields in BOOKKEEPING.items():
        table = identity.get(section, {}) if section else identity
        for f in fields:
            table.pop(f, None)
    for (section, i), path in files.items():
        identity[section][i]["sha256"] = file_digest(path)
    return identity


def check_world(cfg: RLConfig, w: distributed.World) -> None:
    """:class:`~dsv32.distributed.DistError` when a GRPO recipe cannot run over ``w``'s processes:
    the step's groups must split evenly, and the rollouts run in process."""
    if not w.active:
        return
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


def sampling_replica(policy: Policy) -> Policy:
    """What the rollouts sample with: ``policy`` itself in one process; under ``torchrun`` a plain
    copy of its model (taken before it is sharded) that :func:`refresh_replica` refreshes from the
    sharded policy."""
    if not distributed.world().active:
        return policy
    replica = copy.deepcopy(policy.model).eval().requires_grad_(False)
    return Policy(replica, policy.tokenizer, policy.kind, policy.thinking)


def shard_for_training(policy: Policy, ref: Policy | None) -> Policy:
    """The sampling replica of ``policy`` (:func:`sampling_replica`, taken while it is whole), then
    ``ref`` and ``policy`` sharded with FSDP2 (nothing in one process); returns the replica."""
    sampler = sampling_replica(policy)
    if ref is not None:
        distributed.shard_model(ref.model)
    distributed.shard_model(policy.model)
    return sampler


def refresh_replica(policy: Policy, sampler: Policy) -> None:
    """The sharded ``policy``'s current weights copied into its sampling replica ``sampler`` (nothing
    when the policy samples itself)."""
    if sampler is not policy:
        distributed.copy_full_parameters(policy.model, sampler.model)


def reference_policy(policy: Policy, g: GRPOConfig) -> Policy | None:
    """A frozen copy of ``policy`` for the KL term; None when no domain has a KL coefficient."""
    if not (g.kl_coef > 0 or any(v > 0 for v in g.domain_kl_coef.values())):
        return None
    frozen = copy.deepcopy(policy.model).eval().requires_grad_(False)
    return Policy(frozen, policy.tokenizer, policy.kind, policy.thinking)


def make_optimizer(policy: Policy, g: GRPOConfig) -> torch.optim.AdamW:
    """AdamW over the policy, with weight decay on its matrices only."""
    params = list(policy.model.parameters())
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": g.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=g.lr, betas=tuple(g.betas))


def run_steps(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    result: RLResult,
    step_fn: Callable[[int], dict],
    evaluate: Callable[[int, Path], dict] | None,
    cfg: RLConfig,
    *,
    resume: bool,
    progress: bool,
    stop_after: int | None,
    evaluate_before: bool,
    evaluate_after: bool = True,
    on_step: Callable[[dict], None] | None = None,
    desc: str = "grpo",
    run: dict | None = None,
    meta: dict[str, Any] | None = None,
    guard: UpdateGuard | None = None,
) -> RLResult:
    """The loop of a GRPO run under ``result.out_dir``: resume from its latest checkpoint, or start
    over (held-out ``evaluate(0, eval.jsonl)`` first); then ``step_fn(step)`` for ``cfg.grpo.steps``
    steps, each at its warmup learning rate, its record appended to ``metrics.jsonl`` every
    ``cfg.log_every`` steps, at the last, and whenever an update was skipped; ``evaluate``
    every ``cfg.eval.every`` steps and after the last, checkpoints (every ``cfg.save_every`` steps),
    the final model and ``rl.png``. ``stop_after`` stops after that step with a checkpoint, as if
    the process had been killed; ``evaluate`` None: no held-out items. ``run``: the run's identity,
    compared with the checkpoint's before resuming (:mod:`dsv32.runlog`); ``meta``: JSON files
    (name → content) written once every check has passed; ``guard``: the run's
    :class:`~dsv32.training_guard.UpdateGuard`, whose streak of skipped updates is saved with each
    checkpoint and restored on resume. A resumed run cuts ``eval.jsonl`` back to
    the checkpoint's step like ``metrics.jsonl``, and reuses a held-out result logged for a step
    instead of evaluating that step again."""
    from tqdm.auto import tqdm

    from dsv32.rl.grpo.plot import plot_rl_metrics

    out, steps, eval_every, save_every = result.out_dir, cfg.grpo.steps, cfg.eval.every, cfg.save_every
    w = distributed.world()
    ckpts = distributed.ShardedCheckpoints(out, keep=1, run=run)
    metrics_path, eval_path = out / "metrics.jsonl", out / "eval.jsonl"
    step = ckpts.begin(policy.model, optimizer, resume=resume, steps=steps)
    logged: dict[int, dict] = {}
    if step:
        logged = {r["step"]: r for r in read_metrics(eval_path) if r["step"] <= step}
        distributed.barrier()  # every rank has read eval.jsonl before rank 0 cuts it
        if w.main:
            truncate_metrics(metrics_path, step)
            truncate_metrics(eval_path, step)
        if guard is not None:
            guard.restore(ckpts.state(ckpts.resumed_from))
        result.eval_before = logged.get(0)
        logger.info("rl: resumed from %s (step %d)", ckpts.resumed_from, step)
    elif w.main:
        out.mkdir(parents=True, exist_ok=True)
        ckpts.discard((*RUN_OUTPUTS, "rl.png"))
    for name, content in (meta or {}).items() if w.main else ():
        write_json(out / name, content)
    distributed.barrier()
    if not step and evaluate_before and evaluate is not None:
        result.eval_before = evaluate(0, eval_path)
    last = steps if stop_after is None else min(steps, stop_after)
    start = time.time()
    bar = tqdm(total=steps, initial=step, desc=desc, disable=not (progress and w.main), dynamic_ncols=True)
    policy.model.train()
    try:
        while step < last:
            for group in optimizer.param_groups:
                group["lr"] = cfg.grpo.lr * _lr_factor(step, cfg.grpo)
            record = step_fn(step)
            step += 1
            record["seconds"] = round(time.time() - start, 2)
            record["world_size"] = w.size
            logs = step % cfg.log_every == 0 or step == last or record.get("skipped_updates")
            if logs and w.main:
                append_metrics(metrics_path, record)
            result.metrics.append(record)
            if on_step is not None:
                on_step(record)
            bar.set_postfix(reward=f"{record['reward_mean']:.3f}", acc=f"{record['accuracy']:.2f}")
            bar.update(1)
            due = eval_every and step % eval_every == 0 and step < steps and step not in logged
            if due and evaluate is not None:
                evaluate(step, eval_path)
            if (save_every and step % save_every == 0) or step == last:
                check_finite_policy(policy.model, step)  # keep=1: a NaN checkpoint would be the only one
                ckpts.save(step, policy.model, optimizer, skipped_streak=guard.streak if guard else 0)
    finally:
        bar.close()
        policy.model.eval()
    result.steps, result.seconds = step, time.time() - start
    if step >= steps:
        if evaluate is not None and evaluate_after:
            result.eval_after = logged.get(step) or evaluate(step, eval_path)
        with distributed.full_parameters(policy.model) as writer:  # rank 0 writes the full model
            if writer:
                _save_policy(policy, out / "model")
        distributed.barrier()
        result.model_dir = out / "model"
    if w.main:
        plot_rl_metrics(metrics_path, eval_path, out / "rl.png")
    return result


def completion_budget(sampling: SamplingConfig) -> int:
    """The token budget the length penalty is measured against."""
    return sampling.max_new_tokens if sampling.max_turns == 1 else sampling.max_total_tokens


def grpo_step(
    policy,
    ref,
    optimizer,
    tasks,
    reward_fn,
    cfg: RLConfig,
    g: GRPOConfig,
    step: int,
    hook,
    guard: UpdateGuard | None = None,
    engine: RolloutEngine | None = None,
    sampler: Policy | None = None,
) -> dict:
    """One rollout batch and its updates; returns the step's metrics. ``engine`` (default: the
    policy's model in process) samples with weights version ``step``, synced first when it lags by
    more than ``[engine] max_off_policy_steps``; a sample of another version is refused. ``sampler``
    (default: ``policy``): the unsharded replica the rollouts sample with under ``torchrun``
    (:func:`sampling_replica`), refreshed from ``policy`` first; this rank samples its part of the
    step's groups."""
    t0 = time.time()
    mine = distributed.split_evenly(g.prompts_per_step, distributed.world(), "prompts per step")
    step_tasks = tasks.sample(step, g.prompts_per_step)
    batch_tasks = [step_tasks[k] for k in mine]
    policy.model.eval()
    max_lag = cfg.engine.max_off_policy_steps
    sampler = sampler if sampler is not None else policy
    refresh_replica(policy, sampler)
    engine = engine if engine is not None else InProcessEngine(sampler.model)
    sync_s = prepare_engine(engine, sampler.model, step, max_lag)
    # each group on a generator of its own: the same samples at any world size and with any engine
    with torch.no_grad():
        batch = rollout(
            sampler,
            batch_tasks,
            g.group_size,
            cfg.sampling,
            group_generators=[_generator(cfg.seed, step, 1, k) for k in mine],
            keep_routing=g.keep_routing,
            hook=hook,
            engine=engine,
        )
    batch.staleness = check_staleness(batch.weight_versions, step, max_lag)
    policy.model.train()
    t_rollout = time.time() - t0
    judged = judge_counts(reward_fn)
    results = score(reward_fn, batch)
    judged = {k: v - judged[k] for k, v in judge_counts(reward_fn).items()}
    rewards = torch.tensor([r.total for r in results], dtype=torch.float32)
    valid = [getattr(r, "scored", True) for r in results]  # a failed judge request: no reward at all
    advantages = group_advantages(rewards, g.group_size, scale=g.advantage_scale, valid=valid)
    advantages = advantages.to(batch.sequences.device)
    t1 = time.time()
    updates = grpo_update(
        policy,
        optimizer,
        batch,
        advantages,
        g,
        temperature=cfg.sampling.temperature,
        ref=ref,
        generator=_generator(cfg.seed, step, 2),
        guard=guard,
    )
    t_update = time.time() - t1
    judged = {k: round(v) for k, v in zip(judged, distributed.all_sum(list(judged.values())))}
    # the step's samples in global order (every rank's part, rank by rank)
    local = list(
        zip(
            rewards.tolist(), valid, [r.correct for r in results], [t.domain for t in batch.tasks],
            [r.components for r in results], batch.num_tokens, batch.truncated, advantages.tolist(),
        )
    )  # fmt: skip
    samples = [x for part in distributed.all_gather_objects(local) for x in part]
    rewards = torch.tensor([x[0] for x in samples], dtype=torch.float32)
    valid = [x[1] for x in samples]
    correct = [c for _, ok, c, *_ in samples if ok and c is not None]
    groups = torch.tensor([x[7] for x in samples]).view(-1, g.group_size)
    real = rewards[torch.tensor(valid)]  # the means are over the samples that have a reward
    lengths, cut = [x[5] for x in samples], [x[6] for x in samples]
    record = {
        "step": step + 1,
        "lr": optimizer.param_groups[0]["lr"],
        "reward_mean": float(real.mean()) if len(real) else float("nan"),
        "reward_std": float(real.std()) if len(real) > 1 else 0.0,
        "accuracy": sum(correct) / len(correct) if correct else float("nan"),
        "zero_adv_groups": float((groups == 0).all(-1).float().mean()),
        "unscored": len(valid) - sum(valid),
        **judged,
        "length_mean": sum(lengths) / len(samples),
        "length_max": max(lengths),
        "truncated_frac": sum(cut) / len(samples),
        "rollout_s": round(t_rollout, 2),
        "update_s": round(t_update, 2),
    }
    scored = [(x[3], x[0]) for x in samples if x[1]]
    by_domain = mean_by_domain([d for d, _ in scored], [r for _, r in scored])
    if len(by_domain) > 1:
        record["reward_by_domain"] = by_domain
    components: dict[str, list[float]] = {}
    for x in (x for x in samples if x[1]):
        for k, v in x[4].items():
            components.setdefault(k, []).append(v)
    record["reward_components"] = {k: sum(v) / len(v) for k, v in components.items()}
    # The first update is on-policy: its ratio shows the training/inference mismatch alone.
    first, later = updates[0], updates[1:]
    record |= update_means(updates)
    record["first_update_ratio_mean"] = first["ratio_mean"]
    record["first_update_log_ratio_sampling"] = first["log_ratio_sampling"]
    if later:
        record["later_updates_ratio_mean"] = _mean(later)["ratio_mean"]
        record["later_updates_abs_log_ratio"] = _mean(later)["abs_log_ratio"]
    record["first_update_abs_log_ratio"] = first["abs_log_ratio"]
    if engine.name != "in_process":
        record |= {
            "sync_s": round(sync_s, 3),
            "staleness": batch.staleness,
            "staleness_max": max(batch.staleness),
        }
    return record


def mean_by_domain(domains: list[str], rewards: list[float]) -> dict[str, float]:
    """The mean reward of each domain (rows ``domains[i]``, ``rewards[i]``)."""
    by_domain: dict[str, list[float]] = {}
    for d, r in zip(domains, rewards):
        by_domain.setdefault(d, []).append(r)
    return {d: sum(v) / len(v) for d, v in by_domain.items()}


def update_means(updates: list[dict]) -> dict:
    """The step's means over the updates that were applied (over all when none was), and the number
    of updates skipped for a non-finite loss or gradient."""
    applied = [u for u in updates if not u.get("skipped_updates")]
    return _mean(applied or updates) | {"skipped_updates": sum(u.get("skipped_updates", 0) for u in updates)}


def _mean(records: list[dict]) -> dict:
    keys = {k for r in records for k in r}
    return {k: sum(r[k] for r in records if k in r) / sum(1 for r in records if k in r) for k in keys}


def _eval(
    policy, tasks, reward_fn, cfg: RLConfig, step: int, path: Path, progress: bool, extra: dict | None = None
) -> dict:
    t = time.time()
    res = evaluate(policy, tasks, reward_fn, cfg.eval.max_new_tokens, cfg.eval.batch_size)
    res |= {"step": step, "seconds": round(time.time() - t, 1), **(extra or {})}
    if distributed.is_main():
        append_metrics(path, res)
    if progress and distributed.is_main():
        logger.info(
            "rl eval @%d: accuracy %.3f, reward %.3f (%d problems)",
            step,
            res["accuracy"],
            res["reward"],
            res["problems"],
        )
    return res


def run_eval(cfg: RLConfig, progress: bool = True) -> dict:
    """``dsv32 rl eval``: greedy held-out accuracy of ``cfg.policy``, appended to
    ``out_dir/rl_eval.jsonl`` with the policy's name (a training run's own ``eval.jsonl`` beside it is
    left alone)."""
    rewards = rewards_of(cfg)
    tasks = eval_tasks(cfg)
    if not tasks:
        raise RLConfigError("no held-out problems: the recipe has no arithmetic source")
    problem = rewards.task_problem(tasks[0])
    if problem:
        raise RLConfigError(f"held-out problems: {problem}")
    policy = load_policy(cfg.policy.name, thinking=cfg.policy.thinking, device=cfg.policy.device)
    reward_fn = build_reward_fn(
        rewards, max_tokens=completion_budget(cfg.sampling), thinking=cfg.policy.thinking
    )
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    res = _eval(
        policy, tasks, reward_fn, cfg, 0, out / "rl_eval.jsonl", progress, {"policy": cfg.policy.name}
    )
    print(json.dumps({k: v for k, v in res.items() if k != "samples"}))
    return res


def _save_policy(policy: Policy, path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    policy.model.save_pretrained(path)
    if hasattr(policy.tokenizer, "save_pretrained"):
        policy.tokenizer.save_pretrained(path)
    return path


__all__ = ["RLResult", "build_tasks", "evaluate", "grpo_step", "grpo_update", "train_grpo"]
