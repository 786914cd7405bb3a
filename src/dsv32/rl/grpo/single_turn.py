"""GRPO on single-turn prompts (``dsv32 rl train``): the first kind of :class:`GRPOTrainer`.

A step draws ``prompts_per_step`` tasks from the recipe's ``[[sources]]`` mix and samples
``group_size`` completions of each (:func:`sample_prompts`, also used by the single-turn part of a
mixed agentic step), scored by each task's domain reward. The held-out set is the eval split of the
first arithmetic source (greedy accuracy and mean reward).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dsv32 import distributed
from dsv32.rl.engines import check_staleness
from dsv32.rl.grpo.build import SAMPLES, run_identity, step_generator, task_files
from dsv32.rl.grpo.config import RLConfig, RLConfigError
from dsv32.rl.grpo.loss import group_advantages
from dsv32.rl.grpo.metrics import Output, StepSamples
from dsv32.rl.grpo.policy import Policy, load_policy
from dsv32.rl.grpo.rewards import RewardFunction
from dsv32.rl.grpo.rewards.setup import RewardSetup, build_reward_fn, reward_setup, score
from dsv32.rl.grpo.rollout import SamplingConfig, TurnHook, check_context, generation_budget, rollout
from dsv32.rl.grpo.tasks import ArithmeticWordProblems, JsonlTasks, MixedTasks, Task
from dsv32.rl.grpo.trainer import GRPOTrainer, RLResult
from dsv32.runlog import append_metrics


class SingleTurnTrainer(GRPOTrainer):
    """GRPO over the recipe's prompt sources. ``reward_fn`` (default: the recipe's ``[rewards]``)
    scores completions; ``hook`` enables multi-turn rollouts (``sampling.max_turns`` > 1)."""

    def __init__(
        self,
        cfg: RLConfig,
        *,
        policy: Policy | None = None,
        reward_fn: RewardFunction | None = None,
        hook: TurnHook | None = None,
        **kwargs: Any,
    ) -> None:
        self.given_reward_fn, self.hook = reward_fn, hook
        super().__init__(cfg, cfg, policy=policy, **kwargs)

    def prepare(self) -> None:
        self.rewards = rewards_of(self.rl, self.given_reward_fn)
        self.tasks = build_tasks(self.rl, self.rewards)  # every task checked before the model loads
        self.held = eval_tasks(self.rl)

    def load_policy(self) -> Policy:
        p = self.rl.policy
        return load_policy(p.name, thinking=p.thinking, device=p.device)

    def build_reward_fn(self) -> RewardFunction:
        cfg = self.rl
        reward_fn = self.given_reward_fn or build_reward_fn(
            self.rewards, max_tokens=completion_budget(cfg.sampling), thinking=cfg.policy.thinking
        )
        for src, _ in self.tasks.sources:  # every task file's prompt against the window, before step 1
            check_context(self.policy, getattr(src, "tasks", ()), generation_budget(cfg.sampling))
        check_context(self.policy, self.held, cfg.eval.max_new_tokens)
        return reward_fn

    def rollout(self, step: int) -> StepSamples:
        g = self.grpo
        mine = distributed.split_evenly(g.prompts_per_step, self.world, "prompts per step")
        items = self.tasks.sample(step, g.prompts_per_step)
        return sample_prompts(self, step, [items[k] for k in mine], mine, SAMPLES, hook=self.hook)

    def has_held_out(self) -> bool:
        return bool(self.held)

    def held_out(self, policy: Policy) -> dict:
        e = self.rl.eval
        return evaluate(policy, self.held, self.reward_fn, e.max_new_tokens, e.batch_size)

    def identity(self) -> dict:
        return run_identity(self.rl.to_dict(), task_files(self.rl))


def sample_prompts(
    trainer: GRPOTrainer,
    step: int,
    tasks: list[Task],
    keys: list[int],
    stream: int,
    hook: TurnHook | None = None,
) -> StepSamples:
    """``group_size`` samples of each of ``tasks`` (item ``keys[i]`` of the step) with ``trainer``'s
    sampler and engine, scored by its reward, with their group advantages. Each group draws from a
    generator of its own, ``(seed, step, stream, key)``: the same samples at any world size and
    with any engine."""
    rl, g, G = trainer.rl, trainer.grpo, trainer.grpo.group_size
    batch = rollout(
        trainer.sampler,
        tasks,
        G,
        rl.sampling,
        group_generators=[step_generator(rl.seed, step, stream, k) for k in keys],
        keep_routing=g.keep_routing,
        keep_indexing=g.keep_indexing,
        hook=hook,
        engine=trainer.engine,
    )
    batch.staleness = check_staleness(batch.weight_versions, step, rl.engine.max_off_policy_steps)
    results = score(trainer.reward_fn, batch)
    rewards = torch.tensor([r.total for r in results], dtype=torch.float32)
    valid = [getattr(r, "scored", True) for r in results]  # a failed judge request: no reward at all
    advantages = group_advantages(rewards, G, scale=g.advantage_scale, valid=valid)
    outputs = [
        Output(
            key=keys[j // G] * G + j % G,
            reward=reward,
            advantage=adv,
            scored=ok,
            correct=res.correct,
            domain=task.domain,
            truncated=cut,
            components=res.components,
        )
        for j, (res, reward, adv, ok, task, cut) in enumerate(
            zip(results, rewards.tolist(), advantages.tolist(), valid, batch.tasks, batch.truncated)
        )
    ]
    return StepSamples(batch, advantages, outputs, staleness=batch.staleness)


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
    """Run GRPO as configured (``dsv32 rl train``). ``policy``/``reward_fn`` default to those the
    config names; ``stop_after`` interrupts after that step (with a checkpoint), as if the process
    had been killed."""
    trainer = SingleTurnTrainer(cfg, policy=policy, reward_fn=reward_fn, hook=hook, progress=progress)
    try:
        return trainer.fit(
            resume=resume, stop_after=stop_after, evaluate_before=evaluate_before, on_step=on_step
        )
    finally:
        trainer.close()


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


def completion_budget(sampling: SamplingConfig) -> int:
    """The token budget the length penalty is measured against."""
    return sampling.max_new_tokens if sampling.max_turns == 1 else sampling.max_total_tokens


def greedy_config(max_new_tokens: int) -> SamplingConfig:
    return SamplingConfig(temperature=0.0, max_new_tokens=max_new_tokens, max_total_tokens=max_new_tokens)


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
    t = time.time()
    res = evaluate(policy, tasks, reward_fn, cfg.eval.max_new_tokens, cfg.eval.batch_size)
    res |= {"step": 0, "seconds": round(time.time() - t, 1), "policy": cfg.policy.name}
    append_metrics(out / "rl_eval.jsonl", res)
    print(json.dumps({k: v for k, v in res.items() if k != "samples"}))
    return res
