"""The GRPO trainer (paper §3.1), one class for every kind of rollout.

A :class:`GRPOTrainer` is built once from a recipe — seed, policy, frozen reference, FSDP2 sharding,
optimizer, non-finite guard, rollout engine — and runs the loop (:meth:`GRPOTrainer.fit`): resume or
start over, then steps, held-out evaluations, checkpoints, the final model and the plot. One step
(:meth:`GRPOTrainer.step`) is one code path:

1. the engine is brought to the trainer's weights (version ``step``; synced when it lags by more
   than ``[engine] max_off_policy_steps``);
2. :meth:`GRPOTrainer.rollout` samples the step's outputs with π_old, scores them and computes the
   group advantages ``A = R − mean(group)`` — the one method a kind of run overrides (single-turn
   prompts: :class:`dsv32.rl.grpo.single_turn.SingleTurnTrainer`; agentic episodes:
   :class:`dsv32.rl.agentic.trainer.AgenticTrainer`);
3. the mini-batch updates (:func:`~dsv32.rl.grpo.update.grpo_update`) — from the second one on,
   π_θ ≠ π_old: the off-policy regime that the unbiased KL estimate, the Off-Policy Sequence Mask,
   Keep Routing and Keep Sampling Mask exist for;
4. one metrics record (:func:`~dsv32.rl.grpo.metrics.step_record`), the same keys for every kind.

Exact resume: tasks and sampling noise of step ``s`` are functions of ``(seed, s)``
(:func:`~dsv32.rl.grpo.build.step_generator`); a checkpoint holds the policy, the optimizer, the
step and the guard's streak. Under ``torchrun`` (:mod:`dsv32.distributed`) rank ``r`` of ``W`` takes
the ``r``-th of ``W`` equal parts of the step's items and samples them with an unsharded replica of
the policy; the policy and the reference are sharded with FSDP2 and the updates are those of one
process over the global batch. Rank 0 alone writes. Outputs under ``out_dir``: ``metrics.jsonl``,
``eval.jsonl`` (held-out results), ``config.json``, ``rl.png``, ``checkpoints/``, ``model/`` (and
``adapter/`` with ``[lora]``: docs/rl.md, "LoRA").
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dsv32 import distributed
from dsv32.engine.memory import release_free_memory
from dsv32.rl.engines import InProcessEngine, RolloutEngine, build_engine, prepare_engine
from dsv32.rl.grpo import build
from dsv32.rl.grpo.build import (
    UPDATES,
    adapt_policy,
    lr_factor,
    make_optimizer,
    reference_policy,
    refresh_replica,
    shard_for_training,
    step_generator,
    trained_grpo,
)
from dsv32.rl.grpo.config import RLConfig
from dsv32.rl.grpo.metrics import StepSamples, step_record
from dsv32.rl.grpo.policy import Policy, with_precision
from dsv32.rl.grpo.rewards.setup import judge_counts
from dsv32.rl.grpo.update import check_finite_policy, grpo_update, rl_guard
from dsv32.runlog import RUN_OUTPUTS, read_metrics, truncate_metrics, write_json
from dsv32.trackers import Trackers, open_trackers, require

logger = logging.getLogger(__name__)


@dataclass
class RLResult:
    """What a GRPO run did: its steps and seconds, every step's record, the held-out results before
    and after, and where the final model is."""

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


class GRPOTrainer:
    """GRPO over the recipe ``rl`` (``recipe``: the whole recipe it belongs to, for the run's
    identity and ``config.json``). A kind of run overrides :meth:`rollout` and, with held-out items,
    :meth:`held_out`; :meth:`prepare` builds what the kind needs before the model loads (its tasks,
    checked), :meth:`load_policy` the policy when none is given. ``engine``: sample with this engine
    instead of the one ``[engine]`` names (the trainer then does not close it)."""

    desc = "grpo"
    result_type: type[RLResult] = RLResult

    def __init__(
        self,
        recipe: Any,
        rl: RLConfig,
        *,
        policy: Policy | None = None,
        engine: RolloutEngine | None = None,
        progress: bool = True,
    ) -> None:
        self.recipe, self.rl, self.progress = recipe, rl, progress
        self.out = Path(rl.out_dir)
        self.world = distributed.setup()
        self.check_world(self.world)  # before anything loads
        require(rl.report_to)  # a tracker that is not installed stops the run before the model loads
        self.trackers = Trackers()  # opened by fit
        torch.manual_seed(rl.seed)
        self.prepare()
        self.policy = with_precision(policy or self.load_policy(), rl.policy.dtype)
        self.lora = adapt_policy(self.policy, rl.lora, rl.seed)  # before anything reads its parameters
        self.reward_fn = self.build_reward_fn()
        self.grpo = trained_grpo(rl.grpo, self.policy)
        self.ref = reference_policy(self.policy, self.grpo)
        self.sampler = shard_for_training(self.policy, self.ref)
        self.optimizer = make_optimizer(self.policy, self.grpo)
        self.guard = rl_guard(self.grpo.max_skipped_updates)
        self.owns_engine = engine is None
        self.engine = engine if engine is not None else build_engine(rl.engine, self.sampler.model, self.out)
        self.engine.connect()  # an unreachable engine fails here, before the first step

    # ------------------------------------------------------------------ what a kind of run provides
    def check_world(self, w: distributed.World) -> None:
        """A :class:`~dsv32.distributed.DistError` when the recipe cannot run over ``w``."""
        build.check_world(self.rl, w)

    def prepare(self) -> None:
        """The kind's tasks and held-out items, checked before the model loads."""

    def load_policy(self) -> Policy:
        raise NotImplementedError

    def build_reward_fn(self) -> Any:
        """The reward of single-turn samples (None: the kind scores its outputs itself)."""
        return None

    def rollout(self, step: int) -> StepSamples:
        """The step's outputs sampled with :attr:`sampler` through :attr:`engine`, scored, with
        their advantages; this rank's part under ``torchrun``."""
        raise NotImplementedError

    def held_out(self, policy: Policy) -> dict | None:
        """The held-out result of the current weights, sampled with ``policy``
        (:meth:`evaluation_policy`; greedy; every rank gets all of it), or None when the recipe has
        no held-out items."""
        return None

    def evaluation_policy(self, step: int) -> Policy:
        """What held-out evaluations sample with: the rollouts' model in the rollouts' dtype. With an
        in-process engine that samples from a copy in another dtype (``[engine] dtype``) that copy,
        refreshed to the weights of ``step``; otherwise :attr:`sampler` itself."""
        e = self.engine
        if isinstance(e, InProcessEngine) and e.model is not e.source:
            e.sync(self.sampler.model, step)
            return dataclasses.replace(self.sampler, model=e.model)
        return self.sampler

    def identity(self) -> dict:
        """What determines the run (compared with a checkpoint's before resuming)."""
        raise NotImplementedError

    def close(self) -> None:
        if self.owns_engine:
            self.engine.close()

    # ------------------------------------------------------------------ one step
    def step(self, step: int) -> dict:
        """One rollout batch and its updates; returns the step's metrics record."""
        t0 = time.time()
        retried = self.engine.retried
        self.policy.model.eval()
        refresh_replica(self.policy, self.sampler)
        max_lag = self.rl.engine.max_off_policy_steps
        sync_s = prepare_engine(self.engine, self.sampler.model, step, max_lag)
        judged = judge_counts(self.reward_fn)
        with torch.no_grad():
            samples = self.rollout(step)
        judged = {k: v - judged[k] for k, v in judge_counts(self.reward_fn).items()}
        self.policy.model.train()
        t_rollout = time.time() - t0
        t1 = time.time()
        updates = grpo_update(
            self.policy,
            self.optimizer,
            samples.batch,
            samples.advantages.to(samples.batch.sequences.device),
            self.grpo,
            temperature=self.rl.sampling.temperature,
            ref=self.ref,
            generator=step_generator(self.rl.seed, step, UPDATES),
            sequence_ids=samples.sequence_ids,
            global_ids=samples.sequence_ids is not None,
            guard=self.guard,
        )
        t_update = time.time() - t1
        outputs, rows, staleness = samples.outputs, samples.batch.num_tokens, samples.staleness
        del samples
        release_free_memory()  # what the update freed, before the next step's rollouts
        extra: dict[str, Any] = dict(zip(judged, distributed.all_sum(list(judged.values()))))
        extra = {k: round(v) for k, v in extra.items()}
        extra |= {"rollout_s": round(t_rollout, 2), "update_s": round(t_update, 2)}
        if not self.engine.shares_weights:
            staleness = [x for part in distributed.all_gather_objects(staleness) for x in part]
            extra |= {"sync_s": round(sync_s, 3), "staleness": staleness, "staleness_max": max(staleness)}
            extra["engine_retries"] = round(distributed.all_sum([float(self.engine.retried - retried)])[0])
        lr = self.optimizer.param_groups[0]["lr"]
        return step_record(step, lr, outputs, rows, updates, self.grpo.group_size, extra)

    # ------------------------------------------------------------------ held-out evaluation
    def evaluate(self, step: int, path: Path) -> dict:
        """:meth:`held_out` at ``step``, appended to ``path`` (rank 0) with its seconds."""
        refresh_replica(self.policy, self.sampler)
        t = time.time()
        res = self.held_out(self.evaluation_policy(step)) or {}
        res |= {"step": step, "seconds": round(time.time() - t, 1)}
        if distributed.is_main():
            self.trackers.append(path, res, prefix="eval/")
            if self.progress:
                shown = {k: res[k] for k in ("accuracy", "reward", "tool_call_valid") if k in res}
                logger.info(
                    "%s eval @%d: %s", self.desc, step, ", ".join(f"{k} {v:.3f}" for k, v in shown.items())
                )
        return res

    # ------------------------------------------------------------------ the loop
    def fit(
        self,
        *,
        resume: bool = True,
        stop_after: int | None = None,
        evaluate_before: bool = True,
        evaluate_after: bool = True,
        on_step: Callable[[dict], None] | None = None,
    ) -> RLResult:
        """Resume from the latest checkpoint under ``out_dir`` (or start over: held-out evaluation
        first, unless ``evaluate_before`` is False); then :meth:`step` for ``grpo.steps`` steps, each
        at its warm-up learning rate, its record appended to ``metrics.jsonl`` every ``log_every``
        steps, at the last and whenever an update was skipped; held-out evaluations every
        ``eval.every`` steps and after the last; checkpoints every ``save_every`` steps; the final
        model and ``rl.png``. ``stop_after`` stops after that step with a checkpoint, as if the
        process had been killed. A resumed run cuts ``metrics.jsonl`` and ``eval.jsonl`` back to the
        checkpoint's step and reuses a held-out result logged for a step instead of evaluating it
        again."""
        result = self.result_type(self.out, 0, 0.0)
        evaluates = self.has_held_out()
        ckpts = distributed.ShardedCheckpoints(
            self.out, keep=1, trainable_only=self.lora, run=self.identity()
        )  # LoRA: the adapter and its optimizer state
        step, logged = self._begin(ckpts, resume, result)
        eval_path = self.out / "eval.jsonl"
        self.trackers = open_trackers(
            self.rl.report_to,
            self.out,
            config=self.recipe.to_dict(),
            name=self.desc,
            main=self.world.main,
            resumed_step=step,
        )
        steps = self.rl.grpo.steps
        last = steps if stop_after is None else min(steps, stop_after)
        try:
            if not step and evaluate_before and evaluates:
                result.eval_before = self.evaluate(0, eval_path)
            start = time.time()
            step = self._loop(ckpts, step, last, logged, result, on_step, start)
            result.steps, result.seconds = step, time.time() - start
            if result.steps >= steps and evaluates and evaluate_after:
                result.eval_after = logged.get(result.steps) or self.evaluate(result.steps, eval_path)
        finally:
            self.trackers.close()
        if result.steps >= steps:
            self._save_model(self.out / "model")
            result.model_dir = self.out / "model"
        if self.world.main:
            from dsv32.rl.grpo.plot import plot_rl_metrics

            plot_rl_metrics(self.out / "metrics.jsonl", eval_path, self.out / "rl.png")
        return result

    def has_held_out(self) -> bool:
        return False

    def _begin(self, ckpts, resume: bool, result: RLResult) -> tuple[int, dict[int, dict]]:
        """Resume (the checkpoint's step, the held-out results logged up to it) or start over (0)."""
        out, w = self.out, self.world
        step = ckpts.begin(self.policy.model, self.optimizer, resume=resume, steps=self.rl.grpo.steps)
        logged: dict[int, dict] = {}
        if step:
            logged = {r["step"]: r for r in read_metrics(out / "eval.jsonl") if r["step"] <= step}
            distributed.barrier()  # every rank has read eval.jsonl before rank 0 cuts it
            if w.main:
                truncate_metrics(out / "metrics.jsonl", step)
                truncate_metrics(out / "eval.jsonl", step)
            self.guard.restore(ckpts.state(ckpts.resumed_from))
            result.eval_before = logged.get(0)
            logger.info("rl: resumed from %s (step %d)", ckpts.resumed_from, step)
        elif w.main:
            out.mkdir(parents=True, exist_ok=True)
            ckpts.discard((*RUN_OUTPUTS, "rl.png", "adapter"))
        if w.main:
            write_json(out / "config.json", self.recipe.to_dict())
        distributed.barrier()
        return step, logged

    def _loop(
        self, ckpts, step: int, last: int, logged: dict, result: RLResult, on_step, start: float
    ) -> int:
        """Steps ``step + 1`` … ``last``; returns the last step done."""
        from tqdm.auto import tqdm

        g, w, steps = self.rl.grpo, self.world, self.rl.grpo.steps
        bar = tqdm(
            total=steps,
            initial=step,
            desc=self.desc,
            disable=not (self.progress and w.main),
            dynamic_ncols=True,
        )
        self.policy.model.train()
        try:
            while step < last:
                for group in self.optimizer.param_groups:
                    group["lr"] = g.lr * lr_factor(step, g)
                record = self.step(step)
                step += 1
                record["seconds"] = round(time.time() - start, 2)
                record["world_size"] = w.size
                logs = step % self.rl.log_every == 0 or step == last or record.get("skipped_updates")
                if logs and w.main:
                    self.trackers.append(self.out / "metrics.jsonl", record)
                result.metrics.append(record)
                if on_step is not None:
                    on_step(record)
                bar.set_postfix(reward=f"{record['reward_mean']:.3f}", acc=f"{record['accuracy']:.2f}")
                bar.update(1)
                every = self.rl.eval.every
                if (
                    every
                    and step % every == 0
                    and step < steps
                    and step not in logged
                    and self.has_held_out()
                ):
                    self.evaluate(step, self.out / "eval.jsonl")
                if (self.rl.save_every and step % self.rl.save_every == 0) or step == last:
                    check_finite_policy(
                        self.policy.model, step
                    )  # keep=1: a NaN checkpoint would be the only one
                    ckpts.save(step, self.policy.model, self.optimizer, skipped_streak=self.guard.streak)
        finally:
            bar.close()
            self.policy.model.eval()
        return step

    def _save_model(self, path: Path) -> None:
        """The final model under ``path``; with LoRA, the base with the adapter merged in, and the
        adapter alone beside it (``adapter/``, peft's save format)."""
        with distributed.full_parameters(self.policy.model) as writer:  # rank 0 writes the full model
            if writer:
                path.mkdir(parents=True, exist_ok=True)
                if self.lora:
                    from dsv32.engine.lora import merged_copy, save_adapter

                    save_adapter(self.policy.model, path.parent / "adapter", base=self.policy.source)
                    merged_copy(self.policy.model).save_pretrained(path)
                else:
                    self.policy.model.save_pretrained(path)
                if hasattr(self.policy.tokenizer, "save_pretrained"):
                    self.policy.tokenizer.save_pretrained(path)
        distributed.barrier()
