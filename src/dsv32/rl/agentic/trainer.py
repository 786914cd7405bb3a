"""Mixed agentic GRPO (paper §3): one RL stage over environments (multi-turn, tools) and, optionally,
the single-turn domains of :mod:`dsv32.rl.grpo.trainer`, with per-domain weights and KL strengths.

One step:

1. draw ``prompts_per_step`` items from the mix (``[[envs]]`` by weight, plus ``[[sources]]`` when
   ``agentic.single_turn``); G episodes per environment task (:func:`dsv32.rl.agentic.episodes.episodes.run_episodes`,
   all batched), G samples per single-turn prompt (:func:`dsv32.rl.grpo.rollout.rollout`);
2. rewards (verifier + length + language for episodes, the domain reward for single-turn), group
   advantages ``A = R − mean(group)``, spread over every row of an episode;
3. the mini-batch updates of :func:`dsv32.rl.grpo.update.grpo_update` (clipped ratio, unbiased KL with
   per-domain β, OPSM, Keep Sampling Mask, Keep Routing) over the joint batch, with each row's episode
   as its sequence id: an episode laid out in several rows is one output o_i of Eq. 8 (its tokens
   weigh 1/|o_i| together, Eq. 9 decides on all of them), however its rows fall into mini- and
   micro-batches.

Tasks and sampling noise of step ``s`` are functions of ``(seed, s)``: each item's group (its G
episodes, or its G single-turn samples) draws from a generator of its own, seeded by ``(seed, s,
its index in the step)``, and item ``k``'s ``j``-th output is output ``k·G + j`` of the step, the
order the mini-batches are drawn over. A checkpoint holds the policy, the optimizer and the step.

Under ``torchrun`` (:mod:`dsv32.distributed`) rank ``r`` of ``W`` takes the ``r``-th of ``W`` equal
parts of the step's items (``prompts_per_step`` must be a multiple of ``W``) and runs their
episodes and samples with an unsharded replica of the policy (refreshed from the FSDP-sharded policy
before each step and each held-out evaluation, as :func:`dsv32.rl.grpo.trainer.train_grpo` does); the
policy and the reference model are sharded with FSDP2, the updates are those of one process over the
global batch (:func:`dsv32.rl.grpo.update.grpo_update` with the outputs' global ids) and the metrics are
gathered over the ranks. The held-out episodes are split over the ranks. Rank 0 alone writes.

Outputs under ``out_dir``: ``metrics.jsonl``, ``eval.jsonl`` (greedy held-out accuracy and
well-formed tool use), ``rl.png``, ``checkpoints/``, ``model/``.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from dsv32 import distributed
from dsv32.engine.memory import release_free_memory
from dsv32.envs.base import Environment, Task, get_env, resolve_tasks
from dsv32.rl.agentic.episodes.episodes import (
    AgenticReward,
    EpisodeSettings,
    concat_rollouts,
    episode_outcome,
    episode_rows,
    episode_summary,
    episode_versions,
    rl_task,
    rows_to_rollouts,
    run_episodes,
)
from dsv32.rl.agentic.episodes.config import AgenticConfig
from dsv32.rl.engines import InProcessEngine, RolloutEngine, build_engine, check_staleness, prepare_engine
from dsv32.rl.agentic.episodes.fanout import episode_runner
from dsv32.rl.grpo.loss import group_advantages
from dsv32.rl.grpo.policy import Policy, load_policy
from dsv32.rl.grpo.rewards.setup import build_reward_fn, reward_setup, score
from dsv32.rl.grpo.rollout import SamplingConfig, rollout, truncates
from dsv32.rl.grpo.tasks import MixedTasks
from dsv32.rl.grpo.trainer import (
    RLResult,
    _generator,
    build_tasks,
    check_world,
    grpo_update,
    make_optimizer,
    mean_by_domain,
    reference_policy,
    refresh_replica,
    run_identity,
    run_steps,
    shard_for_training,
    task_files,
    update_means,
)
from dsv32.rl.grpo.update import rl_guard
from dsv32.runlog import append_metrics

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EnvItem:
    """One environment task of the mix and how to build a fresh environment for it."""

    task: Task
    domain: str
    make_env: Callable[[], Environment]


@dataclass
class EnvTaskSource:
    tasks: list[Task]
    domain: str
    make_env: Callable[[], Environment]

    def get(self, i: int) -> EnvItem:
        return EnvItem(self.tasks[i % len(self.tasks)], self.domain, self.make_env)


def env_sources(cfg: AgenticConfig) -> tuple[list[tuple[EnvTaskSource, float]], list[EnvItem]]:
    """The ``[[envs]]`` as weighted task sources, and their held-out items (``agentic.eval_tasks``
    per environment)."""
    sources, held = [], []
    for e in cfg.envs:
        make_env = functools.partial(get_env(e.name).factory, **e.options)
        sources.append((EnvTaskSource(resolve_tasks(e.name, e.tasks), e.key, make_env), e.weight))
        if e.eval_tasks and cfg.agentic.eval_tasks:
            held += [
                EnvItem(t, e.key, make_env)
                for t in resolve_tasks(e.name, e.eval_tasks)[: cfg.agentic.eval_tasks]
            ]
    return sources, held


def episode_settings(cfg: AgenticConfig) -> EpisodeSettings:
    a = cfg.agentic
    return EpisodeSettings(
        a.prompt, a.max_steps, a.thinking, a.context, a.context_window or None, a.tool_timeout_s
    )


def agentic_reward(cfg: AgenticConfig) -> AgenticReward:
    a = cfg.agentic
    return AgenticReward(
        cfg.rl.sampling.max_total_tokens, a.length_weight, a.length_shape, a.language_weight, a.format_weight
    )


def v32_policy(cfg: AgenticConfig) -> Policy:
    """The recipe's policy, checked to speak V3.2 (episodes are V3.2 conversations)."""
    from dsv32.chat import missing_special_tokens
    from dsv32.rl.grpo.config import RLConfigError

    policy = load_policy(cfg.rl.policy.name, thinking=cfg.agentic.thinking, device=cfg.rl.policy.device)
    if not hasattr(policy.tokenizer, "get_added_vocab") or missing_special_tokens(policy.tokenizer):
        raise RLConfigError(
            f"policy {cfg.rl.policy.name!r} does not speak V3.2 (its tokenizer lacks the special tokens): "
            "fine-tune it first with dsv32 sft (it adds them), or use a native V3.2 checkpoint"
        )
    return policy


@torch.no_grad()
def evaluate_agentic(
    policy: Policy, items: list[EnvItem], settings: EpisodeSettings, max_new_tokens: int
) -> dict:
    """Greedy episodes on ``items``: accuracy, well-formed tool use (:func:`episode_summary`) and two
    sample conversations. Under ``torchrun`` rank ``r`` runs items ``r, r + W, …`` with ``policy``
    unsharded, and every rank gets the whole result."""
    w = distributed.world()
    mine = list(range(len(items)))[w.rank :: w.size]
    jobs = [(items[i].make_env, items[i].task, items[i].domain) for i in mine]
    episodes = run_episodes(
        policy, jobs, SamplingConfig(temperature=0.0, max_new_tokens=max_new_tokens), settings
    )
    light = [replace(e, records=[replace(r, kept=None, routing=None) for r in e.records]) for e in episodes]
    gathered = sorted(
        (x for part in distributed.all_gather_objects(list(zip(mine, light))) for x in part),
        key=lambda x: x[0],
    )
    every = [e for _, e in gathered]
    summary = episode_summary(every)
    summary["samples"] = [e.trajectory.messages[1:] for e in every[:2]]
    return summary


def agentic_step(
    policy,
    ref,
    optimizer,
    mix: MixedTasks,
    reward_fn,
    cfg: AgenticConfig,
    g,
    step: int,
    guard=None,
    engine: RolloutEngine | None = None,
    runner=None,
    sampler: Policy | None = None,
) -> dict:
    """One joint rollout batch and its updates; returns the step's metrics. ``engine`` samples with
    weights version ``step`` under the rules of ``dsv32 rl train`` (synced first when it lags by more
    than ``[engine] max_off_policy_steps``, a sample of another version refused); ``runner``: where
    the environments live (:func:`dsv32.rl.agentic.episodes.fanout.episode_runner`; default this process);
    ``sampler`` (default: ``policy``): the unsharded replica that samples under ``torchrun``
    (:func:`~dsv32.rl.grpo.trainer.sampling_replica`), refreshed from ``policy`` first; this rank runs
    its part of the step's items."""
    G, t0, seed = g.group_size, time.time(), cfg.rl.seed
    max_lag = cfg.rl.engine.max_off_policy_steps
    mine = distributed.split_evenly(g.prompts_per_step, distributed.world(), "prompts per step")
    policy.model.eval()
    sampler = sampler if sampler is not None else policy
    refresh_replica(policy, sampler)
    engine = engine if engine is not None else InProcessEngine(sampler.model)
    sync_s = prepare_engine(engine, sampler.model, step, max_lag)
    staleness: list[int] = []
    items = mix.sample(step, g.prompts_per_step)
    env_k = [k for k in mine if isinstance(items[k], EnvItem)]
    single_k = [k for k in mine if not isinstance(items[k], EnvItem)]
    jobs = [(items[k].make_env, items[k].task, items[k].domain) for k in env_k for _ in range(G)]
    reward = agentic_reward(cfg)
    batches, advantages = [], []
    sequence_ids: list[int] = []  # each row's output: item k's j-th output is k·G + j
    outputs: list[dict[str, Any]] = []  # what the metrics need of each output
    if jobs:
        groups = [_generator(seed, step, 1, k) for k in env_k]  # a task's G episodes share one
        episodes = run_episodes(
            sampler, jobs, cfg.rl.sampling, episode_settings(cfg),
            generator=[groups[i // G] for i in range(len(jobs))], keep_routing=g.keep_routing,
            engine=engine, runner=runner,
        )  # fmt: skip
        staleness += check_staleness(episode_versions(episodes), step, max_lag)
        for e in episodes:
            e.reward, e.components = reward(e)
        r = torch.tensor([e.reward for e in episodes])
        adv = group_advantages(r, G, scale=g.advantage_scale, valid=[e.scored for e in episodes])
        rows, row_adv, row_tasks = [], [], []
        for i, (e, a) in enumerate(zip(episodes, adv.tolist())):
            key = env_k[i // G] * G + i % G
            for row in episode_rows(e.records):
                rows.append(row)
                row_adv.append(a)
                row_tasks.append(rl_task(e))
                sequence_ids.append(key)
            outputs.append({"key": key, "reward": float(r[i]), "domain": e.domain, **episode_outcome(e)})
        if rows:
            with_kept = truncates(cfg.rl.sampling)
            batches.append(
                rows_to_rollouts(rows, row_tasks, policy.pad_token_id, policy.device, with_kept=with_kept)
            )
            advantages.append(torch.tensor(row_adv))
    if single_k:
        st = rollout(
            sampler,
            [items[k] for k in single_k],
            G,
            cfg.rl.sampling,
            group_generators=[_generator(seed, step, 3, k) for k in single_k],
            keep_routing=g.keep_routing,
            engine=engine,
        )
        staleness += check_staleness(st.weight_versions, step, max_lag)
        results = score(reward_fn, st)
        r = torch.tensor([x.total for x in results], dtype=torch.float32)
        batches.append(st)
        valid = [getattr(x, "scored", True) for x in results]  # a failed judge request: no reward
        advantages.append(group_advantages(r, G, scale=g.advantage_scale, valid=valid))
        keys = [single_k[j // G] * G + j % G for j in range(len(st))]
        sequence_ids += keys
        for key, x, t, reward_j in zip(keys, results, st.tasks, r.tolist()):
            outputs.append({"key": key, "reward": reward_j, "domain": t.domain, "correct": x.correct})
    policy.model.train()
    t_rollout = time.time() - t0
    batch = functools.reduce(lambda a, b: concat_rollouts(a, b, policy.pad_token_id), batches)
    adv = torch.cat(advantages).to(batch.sequences.device)
    t1 = time.time()
    temperature = cfg.rl.sampling.temperature
    updates = grpo_update(
        policy, optimizer, batch, adv, g, temperature=temperature, ref=ref,
        generator=_generator(seed, step, 2), sequence_ids=torch.tensor(sequence_ids), global_ids=True,
        guard=guard,
    )  # fmt: skip
    num_tokens = batch.num_tokens
    del batch, adv, batches, advantages
    release_free_memory()  # what the update freed, before the next step's rollouts
    # the step's outputs over every rank, in the step's order (item by item), and every row's length
    parts = distributed.all_gather_objects((outputs, num_tokens, staleness))
    outs = sorted((o for p in parts for o in p[0]), key=lambda o: o["key"])
    lengths = [n for p in parts for n in p[1]]  # every row's tokens (only their count and sum are used)
    episodes_out = [o for o in outs if "steps" in o]
    rewards = [o["reward"] for o in outs]
    rewards_t = torch.tensor(rewards)
    correct = [bool(o["correct"]) for o in outs if o["correct"] is not None]
    record = {
        "step": step + 1,
        "lr": optimizer.param_groups[0]["lr"],
        "reward_mean": float(rewards_t.mean()),
        "reward_std": float(rewards_t.std()) if len(rewards) > 1 else 0.0,
        "accuracy": sum(correct) / max(1, len(correct)),
        "rows": len(lengths),
        "length_mean": sum(lengths) / len(lengths),
        "truncated_frac": sum(o["stop"] != "answer" for o in episodes_out) / max(1, len(episodes_out)),
        "rollout_s": round(t_rollout, 2),
        "update_s": round(time.time() - t1, 2),
    }
    if episodes_out:
        n = len(episodes_out)
        record["tool_call_valid"] = sum(o["tool_call_valid"] for o in episodes_out) / n
        record["mean_steps"] = sum(o["steps"] for o in episodes_out) / n
    record["reward_by_domain"] = mean_by_domain([o["domain"] for o in outs], rewards)
    first = updates[0]
    record |= update_means(updates)
    record["first_update_abs_log_ratio"] = first["abs_log_ratio"]
    record["first_update_ratio_mean"] = first["ratio_mean"]
    if engine.name != "in_process":
        staleness = [x for p in parts for x in p[2]]
        record |= {"sync_s": round(sync_s, 3), "staleness": staleness, "staleness_max": max(staleness)}
    return record


@dataclass
class AgenticResult(RLResult):
    """What a mixed agentic run did; the held-out numbers are episodes in the environments."""

    def summary(self) -> str:
        lines = [f"dsv32 posttrain rl: {self.steps} steps in {self.seconds:.0f} s → {self.out_dir}"]
        for name, ev in (("before", self.eval_before), ("after", self.eval_after)):
            if ev:
                lines.append(
                    f"held-out {name}: accuracy {ev['accuracy']:.3f}, well-formed tool use {ev['tool_call_valid']:.3f} "
                    f"({ev['episodes']} episodes, greedy)"
                )
        return "\n".join(lines)


def _eval(policy, held, cfg: AgenticConfig, step: int, path: Path) -> dict:
    t = time.time()
    res = evaluate_agentic(policy, held, episode_settings(cfg), cfg.rl.sampling.max_new_tokens)
    res |= {"step": step, "seconds": round(time.time() - t, 1)}
    if distributed.is_main():
        append_metrics(path, res)
        logger.info(
            "agentic eval @%d: accuracy %.3f, tool use %.3f", step, res["accuracy"], res["tool_call_valid"]
        )
    return res


def check_agentic_world(cfg: AgenticConfig, w: distributed.World) -> None:
    """:class:`~dsv32.distributed.DistError` when an agentic GRPO recipe cannot run over ``w``'s
    processes: :func:`~dsv32.rl.grpo.trainer.check_world`'s rules (the step's items split evenly, the
    rollouts sample in process), and the environments run in each process (no ``[ray]``)."""
    check_world(cfg.rl, w)
    if w.active and cfg.rl.ray.address:
        raise distributed.DistError(
            f"[ray] address={cfg.rl.ray.address!r}: on several processes agentic GRPO runs each "
            "process's environments in that process; leave ray.address empty"
        )


def train_agentic(
    cfg: AgenticConfig,
    *,
    policy: Policy | None = None,
    resume: bool = True,
    progress: bool = True,
    stop_after: int | None = None,
    evaluate_before: bool = True,
    evaluate_after: bool = True,
) -> AgenticResult:
    """Run mixed agentic GRPO as configured (see the module docstring)."""
    w = distributed.setup()
    check_agentic_world(cfg, w)  # before anything loads
    rl, g = cfg.rl, cfg.rl.grpo
    torch.manual_seed(rl.seed)
    sources, held = env_sources(cfg)
    if cfg.agentic.single_turn:  # the single-turn tasks and their rewards, checked before the model loads
        rewards = reward_setup(
            rl.rewards, max_tokens=rl.sampling.max_new_tokens, thinking=cfg.agentic.thinking
        )
        sources += build_tasks(rl, rewards).sources
    policy = policy or v32_policy(cfg)
    if g.keep_routing and policy.kind != "native":
        g = replace(g, keep_routing=False)
    reward_fn = None
    if cfg.agentic.single_turn:
        # completions are read in the mode their prompts were rendered in (the policy's)
        reward_fn = build_reward_fn(
            rl.rewards, max_tokens=rl.sampling.max_new_tokens, thinking=policy.thinking
        )
    mix = MixedTasks(sources, seed=rl.seed)
    files = {("envs", i): e.tasks for i, e in enumerate(cfg.envs) if Path(e.tasks).is_file()}
    if cfg.agentic.single_turn:
        files |= task_files(rl)
    out = Path(rl.out_dir)
    ref = reference_policy(policy, g)
    sampler = shard_for_training(policy, ref)
    optimizer = make_optimizer(policy, g)
    guard = rl_guard(g.max_skipped_updates)

    def evaluate(step: int, path: Path) -> dict:
        refresh_replica(policy, sampler)
        return _eval(sampler, held, cfg, step, path)

    engine = build_engine(rl.engine, sampler.model, out)
    runner = episode_runner(rl.ray) if rl.ray.address else None  # none: environments in this process
    try:
        return run_steps(
            policy,
            optimizer,
            AgenticResult(out, 0, 0.0),
            lambda step: agentic_step(
                policy,
                ref,
                optimizer,
                mix,
                reward_fn,
                cfg,
                g,
                step,
                guard,
                engine=engine,
                runner=runner,
                sampler=sampler,
            ),
            evaluate if held else None,
            rl,
            resume=resume,
            progress=progress,
            stop_after=stop_after,
            evaluate_before=evaluate_before,
            evaluate_after=evaluate_after,
            desc="agentic grpo",
            run=run_identity(cfg.to_dict(), files),
            meta={"config.json": cfg.to_dict()},
            guard=guard,
        )
    finally:
        if runner is not None:
            runner.close()
        engine.close()
