"""The transfer run (``dsv32 posttrain proof configs/posttrain-transfer-smollm2.toml``, paper §4.3):
does RL on synthesized general-agent environments carry over to environments and toolsets it never
trained on, where RL on the code interpreter alone does not?

:func:`run_transfer` reads the recipe (:mod:`dsv32.posttrain.transfer_recipe`) and runs the stages of
one :class:`TransferRun` in order:

1. :meth:`TransferRun.prepare` — the synthesized environments (``dsv32 synth envs``' cached set), the
   domain split checked on the task files (no held-out domain, table or tool name in training, no
   general-tools tool name either), the code-interpreter tasks, the general-tools and BFCL suites;
   then the base model with the V3.2 tokens, and only then the run's task files;
2. :meth:`~TransferRun.evaluate` ``base`` — every suite, greedy (``eval/<suite>_base.json``; BFCL's
   ``dsv32 eval`` run directories under ``bfcl/base/``);
3. :meth:`~TransferRun.cold_start` — verified reference transcripts of the training synthesized
   environments and of some code-interpreter tasks, rendered as V3.2 tool-use conversations;
4. :meth:`~TransferRun.sft`, then ``evaluate("sft")``; the SFT weights are kept in memory;
5. :meth:`~TransferRun.grpo` ``rl`` — GRPO on the training synthesized environments (``rl/``), then
   ``evaluate("rl")``;
6. ``grpo("rl_code")`` — GRPO from the same SFT weights on the code interpreter alone
   (``rl_code/``), then ``evaluate("rl_code")``;
7. :meth:`~TransferRun.report` — ``report.{json,md,png}`` (:mod:`dsv32.posttrain.transfer_report`).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsv32.envs.base import Task, get_env, load_tasks, resolve_tasks, save_tasks
from dsv32.posttrain.bfcl import count_entries, evaluate_bfcl
from dsv32.posttrain.report import machine, peak_memory_mb, rl_curve
from dsv32.posttrain.stages import StagedRun
from dsv32.posttrain.transfer_recipe import (
    CODE_ENV,
    CODE_HELDOUT,
    CODE_RL,
    CODE_TRAIN,
    GENERAL_ENV,
    SYNTH_ENV,
    SYNTH_HELDOUT,
    SYNTH_RL,
    SYNTH_TRAIN,
    TransferRecipe,
    read_transfer_recipe,
    section_dict,
)
from dsv32.posttrain.transfer_report import STAGES, transfer_report_dict, write_transfer_report
from dsv32.recipe import RecipeError
from dsv32.rl.agentic import trainer as agentic
from dsv32.rl.agentic.episodes import EpisodeSettings, outcome_summary
from dsv32.rl.agentic.trainer import EnvItem, episode_settings
from dsv32.rl.grpo.policy import Policy, sampling_policy
from dsv32.runlog import read_metrics
from dsv32.synth.coldstart import ColdStartReport, build_coldstart
from dsv32.synth.programmatic import Card, SplitError, cached_set, card_of_bundle, check_disjoint
from dsv32.trackers import require
from dsv32.train.sft import train_sft
from dsv32.train.sft.model import SFTModel, prepare_sft_model, vocab_matrices


def run_transfer(config: str, overrides: list[str], out: str | None, progress: bool = True) -> dict:
    """The transfer run (``report.{json,md,png}`` under the recipe's ``out_dir``, or ``out``); returns
    the report. Every recipe section is checked before anything is synthesized, loaded or written."""
    recipe = read_transfer_recipe(config, overrides, out)
    for report_to in recipe.trackers:  # installed, before anything runs
        require(report_to)
    run = TransferRun.prepare(recipe, progress)
    run.evaluate("base")
    run.cold_start()
    run.sft()
    run.evaluate("sft")
    run.grpo("rl")
    run.evaluate("rl")
    run.grpo("rl_code")
    run.evaluate("rl_code")
    return run.report("dsv32 posttrain proof " + " ".join([config, *[f"--set {o}" for o in overrides]]))


def cards(tasks: list[Task]) -> list[Card]:
    """The split's card of each task's bundle (its domain, tables and tools)."""
    return [card_of_bundle(t.info["bundle"]) for t in tasks]


def check_never_trained(train: list[Task], heldout: list[Task], general: list[Task]) -> dict[str, Any]:
    """Refuse a training task of a held-out domain or with a held-out table or tool name
    (:func:`~dsv32.synth.programmatic.check_disjoint`), or with a tool of the general-tools suite;
    returns what the two sides share that is allowed (general-tools table names, which the model
    never sees)."""
    trained = cards(train)
    check_disjoint(trained, cards(heldout))
    suite = cards(general)
    tools = set().union(*(c.tools for c in suite)) & set().union(*(c.tools for c in trained))
    if tools:
        raise SplitError(f"training environments have tools of the general-tools suite: {sorted(tools)}")
    tables = set().union(*(c.tables for c in suite)) & set().union(*(c.tables for c in trained))
    return {"general_tools_tools_trained": 0, "general_tools_table_names_in_training": sorted(tables)}


def evaluate_in_batches(
    policy: Policy, items: list[EnvItem], settings: EpisodeSettings, max_new_tokens: int, batch: int
) -> dict[str, Any]:
    """:func:`~dsv32.rl.agentic.trainer.evaluate_agentic` on ``items``, ``batch`` episodes at a time
    (memory: each episode holds its KV cache between its model calls), as one summary: every
    outcome in task order, the shares and means over all of them."""
    parts = [
        agentic.evaluate_agentic(policy, items[i : i + batch], settings, max_new_tokens)
        for i in range(0, len(items), batch)
    ]
    outcomes = [o for p in parts for o in p["outcomes"]]
    summary = outcome_summary(outcomes, sum(p["not_scored"] for p in parts))
    return summary | {"samples": parts[0]["samples"]}


@dataclass
class Suites:
    """What every stage is evaluated on."""

    synth_heldout: list[EnvItem]
    general: list[EnvItem]
    code_heldout: list[EnvItem]
    bfcl_entries: int


@dataclass
class TransferRun(StagedRun):
    """What the stages share: the recipe, the tasks, the model (in memory from the base evaluation to
    the last), the SFT weights both arms start from, every evaluation and the stage minutes."""

    recipe: TransferRecipe
    synth_dir: Path
    manifest: dict[str, Any]
    synth_train: list[Task]
    code_train: list[Task]
    suites: Suites
    make_env: dict[str, Callable[[], Any]]
    model: SFTModel
    policy: Policy
    never_trained: dict[str, Any]
    progress: bool = True
    started: float = field(default_factory=time.time)
    load_start: list[float] | None = None
    evals: dict[str, dict[str, dict]] = field(default_factory=dict)
    minutes: dict[str, float] = field(default_factory=dict)
    cold: dict[str, ColdStartReport | None] = field(default_factory=dict)
    sft_state: dict[str, Any] | None = None

    @classmethod
    def prepare(cls, recipe: TransferRecipe, progress: bool = True) -> TransferRun:
        """Synthesize (or reuse) the environments, check the split on the task files, build every
        suite; load the base model; only then create the run's root and write the task files."""
        started, load_start = time.time(), machine()["load_average_1_5_15"]
        s, split = recipe.synth, recipe.split
        minutes = {}
        t = time.time()
        where = cached_set(
            s.envs, s.seed, s.tasks_per_env, heldout=s.heldout_domains or None,
            heldout_fraction=s.heldout_fraction, workers=s.workers,
            progress=(lambda line: print(f"synth envs: {line}", flush=True)) if progress else None,
        )  # fmt: skip
        minutes["synthesize"] = round((time.time() - t) / 60, 2)
        manifest = json.loads((where / "manifest.json").read_text(encoding="utf-8"))
        if sorted(manifest["split"]["heldout"]) != sorted(split.heldout):
            raise RecipeError(
                f"[synth] the set at {where} holds out {manifest['split']['heldout']}, the recipe "
                f"{list(split.heldout)}; remove the set to synthesize it again"
            )
        train = [x for x in load_tasks(where / "train.jsonl") if x.domain in split.train]
        heldout_all = [x for x in load_tasks(where / "heldout.jsonl") if x.domain in split.heldout]
        heldout = heldout_all[: s.heldout or len(heldout_all)]
        if len(heldout) < s.min_heldout:
            raise RecipeError(
                f"[synth] the set holds {len(heldout)} evaluated held-out tasks, fewer than min_heldout = "
                f"{s.min_heldout}; synthesize more environments (envs) or hold out more domains"
            )
        if len(train) <= s.coldstart:
            raise RecipeError(
                f"[synth] coldstart = {s.coldstart} leaves none of the {len(train)} training tasks for GRPO"
            )
        g = recipe.general
        general = [x for name in g.sets for x in resolve_tasks(GENERAL_ENV, name)]
        general = general[: g.tasks or len(general)]
        never = check_never_trained(train, heldout, general)
        code_train, code_heldout = recipe.code_tasks()
        b = recipe.bfcl
        bfcl_entries = count_entries(b.categories, b.per_category)
        make_env = {
            SYNTH_ENV: functools.partial(get_env(SYNTH_ENV).factory, call_timeout_s=s.call_timeout_s),
            GENERAL_ENV: functools.partial(get_env(GENERAL_ENV).factory, call_timeout_s=s.call_timeout_s),
            CODE_ENV: functools.partial(get_env(CODE_ENV).factory, system_prompt=recipe.code.system_prompt),
        }
        suites = Suites(
            [EnvItem(x, SYNTH_ENV, make_env[SYNTH_ENV]) for x in heldout],
            [EnvItem(x, GENERAL_ENV, make_env[GENERAL_ENV]) for x in general],
            [EnvItem(x, CODE_ENV, make_env[CODE_ENV]) for x in code_heldout],
            bfcl_entries,
        )
        sft = recipe.sft.model
        sm = prepare_sft_model(sft.name, sft.device)
        root = recipe.root
        root.mkdir(parents=True, exist_ok=True)
        save_tasks(train, root / SYNTH_TRAIN)
        save_tasks(train[s.coldstart :], root / SYNTH_RL)
        save_tasks(heldout, root / SYNTH_HELDOUT)
        save_tasks(code_train, root / CODE_TRAIN)
        save_tasks(code_train[recipe.code.coldstart :], root / CODE_RL)
        if code_heldout:
            save_tasks(code_heldout, root / CODE_HELDOUT)
        policy = Policy(sm.model, sm.tokenizer, sm.kind, thinking=True, source=sft.name)
        return cls(
            recipe, where, manifest, train, code_train, suites, make_env, sm, policy, never, progress=progress,
            started=started, load_start=load_start, minutes=minutes,
        )  # fmt: skip

    def evaluate(self, stage: str) -> None:
        """Greedy episodes of every agentic suite and the BFCL entries (``eval/<suite>_<stage>.json``),
        sampled in the rollouts' dtype (``[rl.engine] dtype``)."""
        settings = episode_settings(self.recipe.rl)
        policy = sampling_policy(self.policy, self.recipe.rl.rl.engine.dtype)
        max_new = self.recipe.rl.rl.sampling.max_new_tokens
        agentic_suites = {"synth_heldout": self.suites.synth_heldout, "general": self.suites.general,
                          "code_heldout": self.suites.code_heldout}  # fmt: skip
        for suite, items in agentic_suites.items():
            if not items:
                continue
            with self.timed(f"{suite}_{stage}"):
                summary = evaluate_in_batches(policy, items, settings, max_new, self.recipe.synth.eval_batch)
            self.record(suite, stage, summary)
        b = self.recipe.bfcl
        with self.timed(f"bfcl_{stage}"):
            summary = evaluate_bfcl(
                policy.model, self.model.tokenizer, b.categories, b.per_category,
                self.recipe.root / "bfcl" / stage, name=f"{self.recipe.sft.model.name}-{stage}",
                max_tokens=b.max_tokens, batch_size=b.batch_size, thinking=settings.thinking,
                progress=self.progress,
            )  # fmt: skip
        self.record("bfcl", stage, summary)

    def record(self, suite: str, stage: str, summary: dict) -> None:
        self.evals.setdefault(suite, {})[stage] = summary
        self.write_json(f"eval/{suite}_{stage}.json", summary)
        print(
            f"{stage}: {suite} accuracy {summary['accuracy']:.3f}, tool use {summary['tool_call_valid']:.3f} "
            f"({summary['episodes']})",
            flush=True,
        )

    def cold_start(self) -> None:
        """Verified reference transcripts of the first training synthesized environments and of the
        first code-interpreter tasks, in one SFT file (``coldstart.jsonl``)."""
        r = self.recipe
        root = r.root
        with self.timed("cold_start"):
            self.cold["synth"] = build_coldstart(
                self.make_env[SYNTH_ENV], self.synth_train[: r.synth.coldstart], root / "coldstart_synth.jsonl", prompt=r.prompt,
                overwrite=True,
            )  # fmt: skip
            parts = [root / "coldstart_synth.jsonl"]
            self.cold["code"] = None
            if r.code.coldstart:
                self.cold["code"] = build_coldstart(
                    self.make_env[CODE_ENV], self.code_train[: r.code.coldstart], root / "coldstart_code.jsonl",
                    prompt=r.prompt, overwrite=True,
                )  # fmt: skip
                parts.append(root / "coldstart_code.jsonl")
            (root / "coldstart.jsonl").write_text("".join(p.read_text() for p in parts))
        r.sft.data.path = str(root / "coldstart.jsonl")

    def sft(self) -> None:
        """Cold-start SFT of the model in memory (``sft/``); its weights are kept for both arms."""
        with self.timed("sft"):
            train_sft(self.recipe.sft, model=self.model, resume=False, progress=self.progress)
        self.sft_state = {k: v.detach().clone() for k, v in self.model.model.state_dict().items()}

    def grpo(self, arm: str) -> None:
        """GRPO from the SFT weights: ``rl`` on the training synthesized environments, ``rl_code`` on
        the code interpreter alone (same settings)."""
        r = self.recipe
        cfg = r.rl if arm == "rl" else r.rl_code
        if self.sft_state is None:
            raise RuntimeError("GRPO before SFT: the arms start from the SFT weights")
        self.model.model.load_state_dict(self.sft_state)
        if not r.rl_model.train_embeddings:
            for p in vocab_matrices(self.model.model):
                p.requires_grad_(False)
        with self.timed(arm):
            agentic.train_agentic(
                cfg, policy=self.policy, resume=False, progress=self.progress,
                evaluate_before=False, evaluate_after=False,
            )  # fmt: skip

    def report(self, command: str) -> dict:
        """``report.{json,md,png}`` in the run's root; returns the report."""
        root = self.recipe.root
        curves = {arm: rl_curve(read_metrics(root / arm / "metrics.jsonl"), []) for arm in ("rl", "rl_code")}
        report = transfer_report_dict(
            self.evals, self.manifest["counts"]["environments"], (time.time() - self.started) / 60,
            self.details(command), curves,
        )  # fmt: skip
        write_transfer_report(root, report)
        return report

    def details(self, command: str) -> dict[str, Any]:
        r = self.recipe
        grpo = r.rl.rl.grpo
        return {
            "model": r.sft.model.name,
            "recipe": section_dict(r),
            "split": {"train": list(r.split.train), "heldout": list(r.split.heldout)},
            "synth_set": str(self.synth_dir),
            "synth_counts": self.manifest["counts"],
            "never_trained": self.never_trained,
            "tasks": {
                "synth_train": len(self.synth_train),
                "synth_coldstart": r.synth.coldstart,
                "synth_rl_pool": len(self.synth_train) - r.synth.coldstart,
                "synth_heldout": len(self.suites.synth_heldout),
                "general": len(self.suites.general),
                "code_train": len(self.code_train),
                "code_coldstart": r.code.coldstart,
                "code_heldout": len(self.suites.code_heldout),
                "bfcl": self.suites.bfcl_entries,
            },
            "evals": {
                suite: {
                    st: {k: v for k, v in e.items() if k not in ("samples", "outcomes")}
                    for st, e in by.items()
                }
                for suite, by in self.evals.items()
            },
            "cold_start": {k: (v.to_dict() if v else None) for k, v in self.cold.items()},
            "grpo": {
                k: getattr(grpo, k) for k in ("steps", "prompts_per_step", "group_size", "lr", "kl_coef")
            },
            "prompt": r.prompt,
            "stages": list(STAGES),
            "stage_minutes": self.minutes,
            "machine": machine(),
            "load_start": self.load_start,
            "peak_memory_mb": peak_memory_mb(),
            "command": command,
        }
