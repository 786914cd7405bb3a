"""Mixed agentic GRPO (paper §3): one RL stage over environments (multi-turn, tools) and, optionally,
the single-turn domains of :mod:`dsv32.rl.trainer`, with per-domain weights and KL strengths.

One step:

1. draw ``prompts_per_step`` items from the mix (``[[envs]]`` by weight, plus ``[[sources]]`` when
   ``agentic.single_turn``); G episodes per environment task (:func:`dsv32.rl.agentic.run_episodes`,
   all batched), G samples per single-turn prompt (:func:`dsv32.rl.rollout.rollout`);
2. rewards (verifier + length + language for episodes, the domain reward for single-turn), group
   advantages ``A = R − mean(group)``, spread over every row of an episode;
3. the mini-batch updates of :func:`dsv32.rl.update.grpo_update` (clipped ratio, unbiased KL with
   per-domain β, OPSM, Keep Sampling Mask, Keep Routing) over the joint batch, with each row's episode
   as its sequence id: an episode laid out in several rows is one output o_i of Eq. 8 (its tokens
   weigh 1/|o_i| together, Eq. 9 decides on all of them), however its rows fall into mini- and
   micro-batches.

Tasks and sampling noise of step ``s`` are functions of ``(seed, s)``; a checkpoint holds the policy,
the optimizer and the step. Outputs under ``out_dir``: ``metrics.jsonl``, ``eval.jsonl`` (greedy
held-out accuracy and well-formed tool use), ``rl.png``, ``checkpoints/``, ``model/``.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from dsv32 import distributed
from dsv32.envs.base import Environment, Task, get_env, resolve_tasks
from dsv32.rl.agentic import (
    AgenticReward,
    Episode,
    EpisodeSettings,
    concat_rollouts,
    episode_rows,
    episode_summary,
    rl_task,
    rows_to_rollouts,
    run_episodes,
)
from dsv32.rl.agentic_config import AgenticConfig
from dsv32.rl.loss import group_advantages
from dsv32.rl.policy import Policy, load_policy
from dsv32.rl.rewards_setup import build_reward_fn, reward_setup, score
from dsv32.rl.rollout import SamplingConfig, rollout, truncates
from dsv32.rl.tasks import MixedTasks
from dsv32.rl.trainer import (
    RLResult,
    _generator,
    build_tasks,
    grpo_update,
    make_optimizer,
    mean_by_domain,
    reference_policy,
    run_identity,
    run_steps,
    task_files,
    update_means,
)
from dsv32.rl.update import rl_guard
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
    from dsv32.rl.config import RLConfigError

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
    sample conversations."""
    jobs = [(it.make_env, it.task, it.domain) for it in items]
    episodes = run_episodes(
        policy, jobs, SamplingConfig(temperature=0.0, max_new_tokens=max_new_tokens), settings
    )
    summary = episode_summary(episodes)
    summary["samples"] = [e.trajectory.messages[1:] for e in episodes[:2]]
    return summary


def agentic_step(
    policy, ref, optimizer, mix: MixedTasks, reward_fn, cfg: AgenticConfig, g, step: int, guard=None
) -> dict:
    """One joint rollout batch and its updates; returns the step's metrics."""
    G, t0 = g.group_size, time.time()
    items = mix.sample(step, g.prompts_per_step)
    env_items = [it for it in items if isinstance(it, EnvItem)]
    single = [it for it in items if not isinstance(it, EnvItem)]
    jobs = [(it.make_env, it.task, it.domain) for it in env_items for _ in range(G)]
    reward = agentic_reward(cfg)
    batches, advantages, rewards, domains, correct = [], [], [], [], []
    sequence_ids: list[int] = []  # the output each row belongs to: an episode, or a single-turn sample
    episodes: list[Episode] = []
    if jobs:
        episodes = run_episodes(
            policy, jobs, cfg.rl.sampling, episode_settings(cfg),
            generator=_generator(cfg.rl.seed, step, 1), keep_routing=g.keep_routing,
        )  # fmt: skip
        for e in episodes:
            e.reward, e.components = reward(e)
        r = torch.tensor([e.reward for e in episodes])
        adv = group_advantages(r, G, scale=g.advantage_scale, valid=[e.scored for e in episodes])
        rows, row_adv, row_tasks = [], [], []
        for i, (e, a) in enumerate(zip(episodes, adv.tolist())):
            for row in episode_rows(e.records):
                rows.append(row)
                row_adv.append(a)
                row_tasks.append(rl_task(e))
                sequence_ids.append(i)
        if rows:
            with_kept = truncates(cfg.rl.sampling)
            batches.append(
                rows_to_rollouts(rows, row_tasks, policy.pad_token_id, policy.device, with_kept=with_kept)
            )
            advantages.append(torch.tensor(row_adv))
        rewards += r.tolist()
        domains += [e.domain for e in episodes]
        correct += [e.verifier >= 1.0 for e in episodes]
    if single:
        policy.model.eval()
        st = rollout(
            policy,
            single,
            G,
            cfg.rl.sampling,
            generator=_generator(cfg.rl.seed, step, 3),
            keep_routing=g.keep_routing,
        )
        results = score(reward_fn, st)
        r = torch.tensor([x.total for x in results], dtype=torch.float32)
        batches.append(st)
        valid = [getattr(x, "scored", True) for x in results]  # a failed judge request: no reward
        advantages.append(group_advantages(r, G, scale=g.advantage_scale, valid=valid))
        sequence_ids += range(len(episodes), len(episodes) + len(st))
        rewards += r.tolist()
        domains += [t.domain for t in st.tasks]
        correct += [bool(x.correct) for x in results if x.correct is not None]
    policy.model.train()
    t_rollout = time.time() - t0
    batch = functools.reduce(lambda a, b: concat_rollouts(a, b, policy.pad_token_id), batches)
    adv = torch.cat(advantages).to(batch.sequences.device)
    t1 = time.time()
    temperature = cfg.rl.sampling.temperature
    updates = grpo_update(
        policy, optimizer, batch, adv, g, temperature=temperature, ref=ref,
        generator=_generator(cfg.rl.seed, step, 2), sequence_ids=torch.tensor(sequence_ids), guard=guard,
    )  # fmt: skip
    rewards_t = torch.tensor(rewards)
    record = {
        "step": step + 1,
        "lr": optimizer.param_groups[0]["lr"],
        "reward_mean": float(rewards_t.mean()),
        "reward_std": float(rewards_t.std()) if len(rewards) > 1 else 0.0,
        "accuracy": sum(correct) / max(1, len(correct)),
        "rows": len(batch),
        "length_mean": sum(batch.num_tokens) / len(batch),
        "truncated_frac": sum(e.trajectory.stop_reason != "answer" for e in episodes) / max(1, len(episodes)),
        "rollout_s": round(t_rollout, 2),
        "update_s": round(time.time() - t1, 2),
    }
    if episodes:
        summary = episode_summary(episodes)
        record |= {"tool_call_valid": summary["tool_call_valid"], "mean_steps": summary["mean_steps"]}
    record["reward_by_domain"] = mean_by_domain(domains, rewards)
    first = updates[0]
    record |= update_means(updates)
    record["first_update_abs_log_ratio"] = first["abs_log_ratio"]
    record["first_update_ratio_mean"] = first["ratio_mean"]
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
    append_metrics(path, res)
    logger.info(
        "agentic eval @%d: accuracy %.3f, tool use %.3f", step, res["accuracy"], res["tool_call_valid"]
    )
    return res


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
    distributed.require_one_process("agentic GRPO")
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
    optimizer = make_optimizer(policy, g)
    guard = rl_guard(g.max_skipped_updates)

    def evaluate(step: int, path: Path) -> dict:
        return _eval(policy, held, cfg, step, path)

    return run_steps(
        policy,
        optimizer,
        AgenticResult(out, 0, 0.0),
        lambda step: agentic_step(policy, ref, optimizer, mix, reward_fn, cfg, g, step, guard),
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
