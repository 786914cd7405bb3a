"""Agentic GRPO (paper §3): the :class:`~dsv32.rl.grpo.trainer.GRPOTrainer` whose outputs are
episodes in environments (multi-turn, tools), mixed, optionally, with the single-turn domains of
:mod:`dsv32.rl.grpo.single_turn` in one RL stage, with per-domain weights and KL strengths.

:meth:`AgenticTrainer.rollout` draws ``prompts_per_step`` items from the mix (``[[envs]]`` by weight,
plus ``[[sources]]`` when ``agentic.single_turn``) and runs G episodes per environment task
(:func:`~dsv32.rl.agentic.episodes.run_episodes`, all batched) and G samples per single-turn prompt.
Episodes are rewarded by verifier + length + language + format, their group advantage spread over
every row of the episode; each row carries its episode's output key as its sequence id, so an
episode laid out in several rows is one output o_i of Eq. 8 (its tokens weigh 1/|o_i| together,
Eq. 9 decides on all of them), however its rows fall into mini- and micro-batches. Item ``k``'s
``j``-th output is output ``k·G + j`` of the step, episodes and single-turn samples alike.

Under ``torchrun`` each rank runs its part of the step's items and of the held-out episodes in its
own process (no ``[ray]``). Outputs under ``out_dir`` as every GRPO run's, ``eval.jsonl`` holding
greedy held-out accuracy and well-formed tool use.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from dsv32 import distributed
from dsv32.envs.base import Environment, Task, get_env, resolve_tasks
from dsv32.rl.agentic.config import AgenticConfig
from dsv32.rl.agentic.episodes import (
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
from dsv32.rl.agentic.fanout import episode_runner
from dsv32.rl.engines import check_staleness
from dsv32.rl.grpo.build import MIXED_PROMPTS, SAMPLES, check_world, run_identity, step_generator, task_files
from dsv32.rl.grpo.loss import group_advantages
from dsv32.rl.grpo.metrics import Output, StepSamples
from dsv32.rl.grpo.policy import Policy, load_policy
from dsv32.rl.grpo.rewards import RewardFunction
from dsv32.rl.grpo.rewards.setup import build_reward_fn, reward_setup
from dsv32.rl.grpo.rollout import SamplingConfig, truncates
from dsv32.rl.grpo.single_turn import build_tasks, sample_prompts
from dsv32.rl.grpo.tasks import MixedTasks
from dsv32.rl.grpo.trainer import GRPOTrainer, RLResult

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
    light = [
        replace(e, records=[replace(r, kept=None, routing=None, indexing=None) for r in e.records])
        for e in episodes
    ]
    gathered = sorted(
        (x for part in distributed.all_gather_objects(list(zip(mine, light))) for x in part),
        key=lambda x: x[0],
    )
    every = [e for _, e in gathered]
    summary = episode_summary(every)
    summary["samples"] = [e.trajectory.messages[1:] for e in every[:2]]
    return summary


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


class AgenticTrainer(GRPOTrainer):
    """GRPO whose outputs are episodes in the recipe's environments (and, with
    ``agentic.single_turn``, single-turn samples of its prompt sources in the same step)."""

    desc = "agentic grpo"
    result_type = AgenticResult

    def __init__(self, cfg: AgenticConfig, *, policy: Policy | None = None, **kwargs: Any) -> None:
        self.cfg = cfg
        super().__init__(cfg, cfg.rl, policy=policy, **kwargs)
        self.settings, self.reward = episode_settings(cfg), agentic_reward(cfg)
        # none: the environments live in this process
        self.runner = episode_runner(cfg.rl.ray) if cfg.rl.ray.address else None

    def check_world(self, w: distributed.World) -> None:
        check_agentic_world(self.cfg, w)

    def prepare(self) -> None:
        rl, a = self.rl, self.cfg.agentic
        sources, self.held = env_sources(self.cfg)
        if a.single_turn:  # the single-turn tasks and their rewards, checked before the model loads
            rewards = reward_setup(rl.rewards, max_tokens=rl.sampling.max_new_tokens, thinking=a.thinking)
            sources += build_tasks(rl, rewards).sources
        self.mix = MixedTasks(sources, seed=rl.seed)

    def load_policy(self) -> Policy:
        return v32_policy(self.cfg)

    def build_reward_fn(self) -> RewardFunction | None:
        if not self.cfg.agentic.single_turn:
            return None
        # completions are read in the mode their prompts were rendered in (the policy's)
        rl = self.rl
        return build_reward_fn(
            rl.rewards, max_tokens=rl.sampling.max_new_tokens, thinking=self.policy.thinking
        )

    def rollout(self, step: int) -> StepSamples:
        """The step's items: G episodes per environment task, all batched (item ``k``'s group on the
        generator ``(seed, step, SAMPLES, k)``), then G samples per single-turn prompt; an episode's
        rows share its output key as their sequence id and its advantage."""
        mine = distributed.split_evenly(self.grpo.prompts_per_step, self.world, "prompts per step")
        items = self.mix.sample(step, self.grpo.prompts_per_step)
        env_k = [k for k in mine if isinstance(items[k], EnvItem)]
        single_k = [k for k in mine if not isinstance(items[k], EnvItem)]
        parts = []
        if env_k:
            parts.append(self.episodes(step, [items[k] for k in env_k], env_k))
        if single_k:
            part = sample_prompts(self, step, [items[k] for k in single_k], single_k, MIXED_PROMPTS)
            part.sequence_ids = torch.tensor([o.key for o in part.outputs])
            parts.append(part)
        with_rows = [p for p in parts if p.batch is not None]  # an episode may have sampled nothing
        pad = self.policy.pad_token_id
        return StepSamples(
            functools.reduce(lambda a, b: concat_rollouts(a, b, pad), [p.batch for p in with_rows]),
            torch.cat([p.advantages for p in with_rows]),
            [o for p in parts for o in p.outputs],
            torch.cat([p.sequence_ids for p in with_rows]),
            [s for p in parts for s in p.staleness],
        )

    def episodes(self, step: int, items: list[EnvItem], keys: list[int]) -> StepSamples:
        """G episodes of each of ``items`` (item ``keys[i]`` of the step), rewarded, laid out as rows."""
        rl, G = self.rl, self.grpo.group_size
        jobs = [(item.make_env, item.task, item.domain) for item in items for _ in range(G)]
        groups = [step_generator(rl.seed, step, SAMPLES, k) for k in keys]  # a task's G episodes share one
        episodes = run_episodes(
            self.sampler, jobs, rl.sampling, self.settings, generator=[groups[i // G] for i in range(len(jobs))],
            keep_routing=self.grpo.keep_routing, engine=self.engine, runner=self.runner,
            keep_indexing=self.grpo.keep_indexing,
        )  # fmt: skip
        staleness = check_staleness(episode_versions(episodes), step, rl.engine.max_off_policy_steps)
        for e in episodes:
            e.reward, e.components = self.reward(e)
        r = torch.tensor([e.reward for e in episodes])
        adv = group_advantages(r, G, scale=self.grpo.advantage_scale, valid=[e.scored for e in episodes])
        rows, row_adv, row_tasks, ids, outputs = [], [], [], [], []
        for i, (e, a) in enumerate(zip(episodes, adv.tolist())):
            key = keys[i // G] * G + i % G
            for row in episode_rows(e.records):
                rows.append(row)
                row_adv.append(a)
                row_tasks.append(rl_task(e))
                ids.append(key)
            outcome = episode_outcome(e)
            outputs.append(
                Output(
                    key=key, reward=float(r[i]), advantage=a, scored=e.scored, correct=outcome["correct"],
                    domain=e.domain, truncated=outcome["stop"] != "answer", components=e.components,
                    episode={"steps": outcome["steps"], "tool_call_valid": outcome["tool_call_valid"]},
                )
            )  # fmt: skip
        batch = None
        if rows:
            with_kept = truncates(rl.sampling)
            batch = rows_to_rollouts(
                rows, row_tasks, self.policy.pad_token_id, self.policy.device, with_kept=with_kept
            )
        return StepSamples(
            batch, torch.tensor(row_adv), outputs, torch.tensor(ids, dtype=torch.long), staleness
        )

    def has_held_out(self) -> bool:
        return bool(self.held)

    def held_out(self, policy: Policy) -> dict:
        return evaluate_agentic(policy, self.held, self.settings, self.rl.sampling.max_new_tokens)

    def identity(self) -> dict:
        files = {("envs", i): e.tasks for i, e in enumerate(self.cfg.envs) if Path(e.tasks).is_file()}
        if self.cfg.agentic.single_turn:
            files |= task_files(self.rl)
        return run_identity(self.cfg.to_dict(), files)

    def close(self) -> None:
        try:
            if self.runner is not None:
                self.runner.close()
        finally:
            super().close()


def check_agentic_world(cfg: AgenticConfig, w: distributed.World) -> None:
    """:class:`~dsv32.distributed.DistError` when an agentic GRPO recipe cannot run over ``w``'s
    processes: :func:`~dsv32.rl.grpo.build.check_world`'s rules (the step's items split evenly, the
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
    trainer = AgenticTrainer(cfg, policy=policy, progress=progress)
    try:
        return trainer.fit(
            resume=resume,
            stop_after=stop_after,
            evaluate_before=evaluate_before,
            evaluate_after=evaluate_after,
        )
    finally:
        trainer.close()
