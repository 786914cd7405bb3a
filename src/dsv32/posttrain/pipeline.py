"""The proof run of post-training (``dsv32 posttrain proof``): held-out greedy accuracy and well-formed
tool use of the base model, after cold-start SFT on verified tool transcripts, and after agentic
GRPO, with the held-out curve during GRPO and, with ``[transfer]``, an environment never trained on.

:func:`run_proof` reads the recipe and runs the stages in order on one :class:`ProofRun`, the state
they share (the tasks, the model in memory, the evaluations, the stage timings):

1. :meth:`ProofRun.evaluate` ``base`` — greedy episodes on the held-out tasks (``eval_base.json``);
2. :meth:`ProofRun.cold_start` — verified reference transcripts (``coldstart.jsonl``, and
   ``validation.jsonl`` for the SFT stage's held-out loss);
3. :meth:`ProofRun.sft` — SFT on them (``sft/``), then :meth:`~ProofRun.evaluate` ``sft``;
4. :meth:`ProofRun.draw_rl_pool` — with ``rl_pool = "unsolved"``, the training tasks the SFT model
   leaves unsolved (``rl_pool_sft.json``, ``tasks_rl.jsonl``);
5. :meth:`ProofRun.grpo` — agentic GRPO from the SFT model (``rl/``), then :meth:`~ProofRun.evaluate`
   ``rl``;
6. :meth:`ProofRun.report` — ``report.{json,md,png}`` (:mod:`dsv32.posttrain.report`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dsv32.envs.base import Environment, Task, get_env, resolve_tasks
from dsv32.envs.interpreter import InterpreterEnv
from dsv32.posttrain.recipe import PosttrainRecipe, read_posttrain_recipe
from dsv32.posttrain.report import first_tasks, machine, peak_memory_mb, report_dict, rl_curve, write_report
from dsv32.posttrain.stages import StagedRun
from dsv32.recipe import read_recipe
from dsv32.rl.agentic import trainer as agentic
from dsv32.rl.agentic.episodes import EpisodeSettings
from dsv32.rl.agentic.trainer import EnvItem, episode_settings
from dsv32.rl.grpo.policy import Policy, sampling_policy
from dsv32.runlog import read_metrics
from dsv32.synth.coldstart import ColdStartReport, build_coldstart
from dsv32.trackers import require
from dsv32.train.sft import train_sft
from dsv32.train.sft.model import SFTModel, prepare_sft_model, vocab_matrices

#: The environment every stage trains and evaluates in (the transfer environment aside).
DOMAIN = "code-interpreter"


def run_proof(config: str | None, overrides: list[str], out: str | None, progress: bool = True) -> dict:
    """The proof run (``report.{json,md,png}`` under the recipe's ``out_dir``, or ``out``); returns the
    report. Every recipe section is checked before anything is loaded or written. A recipe with
    ``[synth]`` is the transfer recipe (:func:`dsv32.posttrain.transfer.run_transfer`)."""
    from dsv32.posttrain.transfer_recipe import is_transfer_recipe

    if config is not None and is_transfer_recipe(read_recipe(config)):
        from dsv32.posttrain.transfer import run_transfer

        return run_transfer(config, overrides, out, progress)
    recipe = read_posttrain_recipe(config, overrides, out)
    for report_to in recipe.trackers:  # the stages' trackers are installed, before the model loads
        require(report_to)
    run = ProofRun.prepare(recipe, progress)
    run.evaluate("base")
    run.cold_start()
    run.sft()
    run.evaluate("sft")
    run.draw_rl_pool()
    run.grpo()
    run.evaluate("rl")
    return run.report(proof_command(config, overrides))


def proof_command(config: str | None, overrides: list[str]) -> str:
    """The command line that reruns the proof, as the report states it."""
    return "dsv32 posttrain proof " + " ".join([config or "", *[f"--set {o}" for o in overrides]]).strip()


def transfer_items(recipe: PosttrainRecipe) -> list[EnvItem]:
    """The ``[transfer]`` environment's tasks (the first ``tasks`` of its set ``set``); none without it."""
    t = recipe.transfer
    if t is None:
        return []
    return [EnvItem(x, t.env, get_env(t.env).factory) for x in resolve_tasks(t.env, t.set)[: t.tasks]]


@dataclass
class ProofRun(StagedRun):
    """What the stages of one proof run share: the recipe, its tasks, the model being post-trained
    (in memory from the base evaluation to the last), each stage's evaluations and minutes."""

    recipe: PosttrainRecipe
    train: list[Task]
    heldout: list[Task]
    validation: list[Task]
    transfer_items: list[EnvItem]
    model: SFTModel
    policy: Policy
    make_env: Callable[[], Environment]
    settings: EpisodeSettings
    progress: bool = True
    started: float = field(default_factory=time.time)
    load_start: list[float] | None = None
    evals: dict[str, dict] = field(default_factory=dict)
    transfer: dict[str, dict] = field(default_factory=dict)
    minutes: dict[str, float] = field(default_factory=dict)
    cold: ColdStartReport | None = None
    pool: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def prepare(cls, recipe: PosttrainRecipe, progress: bool = True) -> ProofRun:
        """Generate the tasks, load the base model with the V3.2 tokens, and only then create the
        run's root and write the task files (bad input writes nothing)."""
        train, heldout = recipe.generate_tasks()
        validation = recipe.validation_tasks(train)
        transfer = transfer_items(recipe)
        started, load_start = time.time(), machine()["load_average_1_5_15"]
        sft = recipe.sft.model
        sm = prepare_sft_model(sft.name, sft.device)
        recipe.root.mkdir(parents=True, exist_ok=True)
        recipe.write_tasks(train, heldout, validation)
        return cls(
            recipe, train, heldout, validation, transfer, sm,
            Policy(sm.model, sm.tokenizer, sm.kind, thinking=True, source=sft.name),
            functools.partial(InterpreterEnv, **recipe.tasks.env_options), episode_settings(recipe.rl),
            progress=progress, started=started, load_start=load_start,
        )  # fmt: skip

    @property
    def max_new(self) -> int:
        return self.recipe.rl.rl.sampling.max_new_tokens

    def evaluator(self) -> Policy:
        """What an evaluation samples with: the model in memory in the rollouts' dtype
        (``[rl.engine] dtype``; a bf16 copy of the weights of the moment, or the model itself)."""
        return sampling_policy(self.policy, self.recipe.rl.rl.engine.dtype)

    def items(self, tasks: list[Task]) -> list[EnvItem]:
        return [EnvItem(t, DOMAIN, self.make_env) for t in tasks]

    def evaluate(self, stage: str) -> None:
        """Greedy episodes on the held-out tasks (``eval_{stage}.json``) and, with ``[transfer]``, on
        the transfer environment's tasks (``transfer_{stage}.json``), both sampled by one
        :meth:`evaluator`."""
        policy = self.evaluator()
        with self.timed(f"eval_{stage}"):
            summary = agentic.evaluate_agentic(policy, self.items(self.heldout), self.settings, self.max_new)
        self.evals[stage] = summary
        self.write_json(f"eval_{stage}.json", summary)
        print(
            f"{stage}: accuracy {summary['accuracy']:.3f}, tool use {summary['tool_call_valid']:.3f}",
            flush=True,
        )
        if self.transfer_items:
            self.evaluate_transfer(stage, policy)

    def evaluate_transfer(self, stage: str, policy: Policy) -> None:
        t, settings = self.recipe.transfer, self.settings
        other = EpisodeSettings(
            t.prompt, t.max_steps, settings.thinking, tool_timeout_s=settings.tool_timeout_s
        )
        with self.timed(f"transfer_{stage}"):
            self.transfer[stage] = agentic.evaluate_agentic(policy, self.transfer_items, other, self.max_new)
        self.write_json(f"transfer_{stage}.json", self.transfer[stage])
        print(f"{stage}: transfer ({t.env}) accuracy {self.transfer[stage]['accuracy']:.3f}", flush=True)

    def cold_start(self) -> None:
        """Verified reference transcripts of the cold-start tasks (``coldstart.jsonl``: the SFT data)
        and of the validation tasks (``validation.jsonl``: the SFT stage's held-out loss)."""
        r = self.recipe
        with self.timed("cold_start"):
            self.cold = build_coldstart(
                self.make_env, r.coldstart_tasks(self.train), r.root / "coldstart.jsonl",
                prompt=r.tasks.prompt, overwrite=True,
            )  # fmt: skip
            if self.validation:
                build_coldstart(
                    self.make_env, self.validation, r.root / "validation.jsonl",
                    prompt=r.tasks.prompt, overwrite=True,
                )  # fmt: skip
                r.sft.data.eval_path = str(r.root / "validation.jsonl")
        r.sft.data.path = str(r.root / "coldstart.jsonl")

    def sft(self) -> None:
        """Cold-start SFT of the model in memory (``sft/``)."""
        with self.timed("sft"):
            train_sft(self.recipe.sft, model=self.model, resume=False, progress=self.progress)

    def draw_rl_pool(self) -> None:
        """What GRPO draws from: every training task, or (``rl_pool = "unsolved"``) those the SFT model
        does not solve greedily (``rl_pool_sft.json``: its pass over the training tasks)."""
        r = self.recipe
        self.pool = {"rule": "all", "train": len(self.train), "pool": len(self.train)}
        if r.tasks.rl_pool != "unsolved":
            return
        with self.timed("rl_pool"):
            passed = agentic.evaluate_agentic(
                self.evaluator(), self.items(self.train), self.settings, self.max_new
            )
        self.write_json("rl_pool_sft.json", passed)
        self.pool = r.use_rl_pool(self.train, {o["id"] for o in passed["outcomes"] if o["correct"]})
        print(
            f"rl pool: {self.pool['pool']} of {len(self.train)} training tasks (the SFT model solves "
            f"{self.pool['solved_by_sft']} greedily)",
            flush=True,
        )

    def grpo(self) -> None:
        """Agentic GRPO from the SFT model in memory (``rl/``); the trainer measures the held-out
        curve on the first ``tasks.curve`` held-out tasks every ``rl.eval.every`` steps."""
        r, cfg = self.recipe, self.recipe.rl
        cfg.rl.policy.name = str(r.root / "sft" / "model")
        if not r.rl_model.train_embeddings:
            for p in vocab_matrices(self.model.model):
                p.requires_grad_(False)
        if cfg.rl.eval.every:
            cfg.agentic.eval_tasks = r.tasks.curve_tasks
        with self.timed("rl"):
            agentic.train_agentic(
                cfg, policy=self.policy, resume=False, progress=self.progress,
                evaluate_before=False, evaluate_after=False,
            )  # fmt: skip

    def report(self, command: str) -> dict:
        """``report.{json,md,png}`` in the run's root; returns the report."""
        root = self.recipe.root
        rl_metrics = read_metrics(root / "rl" / "metrics.jsonl")
        curve = rl_curve(rl_metrics, self.curve_points())
        details = self.details(rl_metrics, command)
        minutes = (time.time() - self.started) / 60
        report = report_dict(
            self.evals, len(self.heldout), minutes, details, transfer=self.transfer_report(), curve=curve
        )
        write_report(root, report, read_metrics(root / "sft" / "metrics.jsonl"), rl_metrics)
        return report

    def curve_points(self) -> list[dict]:
        """The held-out curve during GRPO: the SFT evaluation (step 0), the trainer's evaluations and
        the GRPO evaluation (the last step), every point over the same (first) held-out tasks."""
        log = self.recipe.root / "rl" / "eval.jsonl"
        n = self.recipe.tasks.curve_tasks
        return [
            {**first_tasks(self.evals["sft"], n), "step": 0},
            *(read_metrics(log) if log.exists() else []),
            {**first_tasks(self.evals["rl"], n), "step": self.recipe.rl.rl.grpo.steps},
        ]

    def details(self, rl_metrics: list[dict], command: str) -> dict[str, Any]:
        """The report's ``details``: per-stage summaries, task counts, GRPO settings, timings, machine."""
        r, tasks = self.recipe, self.recipe.tasks
        difficulty = f"difficulty {tasks.difficulty}" if tasks.difficulty else "difficulties 1-5"
        grpo = r.rl.rl.grpo
        ratios = [x["first_update_abs_log_ratio"] for x in rl_metrics if "first_update_abs_log_ratio" in x]
        return {
            "model": r.sft.model.name,
            "task": f"{DOMAIN} {'/'.join(tasks.categories)}, " + difficulty,
            "evals": {
                k: {x: y for x, y in v.items() if x not in ("samples", "outcomes")}
                for k, v in self.evals.items()
            },
            "cold_start": self.cold.to_dict(),
            "tasks": {
                "train": len(self.train),
                "coldstart": len(r.coldstart_tasks(self.train)),
                "heldout": len(self.heldout),
                "validation": len(self.validation),
                "shared_prompts": 0,  # generate_tasks / validation_tasks refuse any
                "rl_pool": self.pool,
            },
            "grpo": {
                k: getattr(grpo, k) for k in ("steps", "prompts_per_step", "group_size", "lr", "kl_coef")
            },
            "stage_minutes": self.minutes,
            "machine": machine(),
            "load_start": self.load_start,
            "peak_memory_mb": peak_memory_mb(),
            "rl_trained_parameters": sum(p.numel() for p in self.model.model.parameters() if p.requires_grad),
            "first_update_abs_log_ratio_max": max(ratios, default=None),
            "command": command,
        }

    def transfer_report(self) -> dict[str, Any] | None:
        """The transfer environment's accuracy and well-formed tool use per stage; None without it."""
        if not self.transfer_items:
            return None
        t = self.recipe.transfer
        out: dict[str, Any] = {
            "env": t.env,
            "set": t.set,
            "tasks": len(self.transfer_items),
            "prompt": t.prompt,
        }
        for stage, summary in self.transfer.items():
            out[f"accuracy_{stage}"] = summary["accuracy"]
            out[f"tool_call_valid_{stage}"] = summary["tool_call_valid"]
        return out
