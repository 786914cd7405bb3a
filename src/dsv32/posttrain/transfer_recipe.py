"""The transfer recipe (``configs/posttrain-transfer-smollm2.toml``, paper §4.3): RL on synthesized
general-agent environments against RL on the code interpreter alone, both from one cold-start SFT
model, evaluated on environments, toolsets and function-calling tasks neither trained on.

Sections, read and checked as one before anything is synthesized, loaded or written:

- ``[synth]``: the programmatic environments (``dsv32 synth envs``' library function, cached): how
  many, the seed, the domain split (``heldout_domains``, or ``heldout_fraction`` of the vocabulary
  drawn with the seed; ``train_domains`` narrows the training side), how many training tasks the cold
  start replays and how many held-out tasks are evaluated;
- ``[code]``: generated code-interpreter tasks — the cold start's code transcripts and the code-only
  arm's GRPO tasks (training: seed 0), its in-domain check (held-out: seed 1);
- ``[general]``: the hand-written ``general-tools`` sets (trip, inventory, calendar) evaluated at
  every stage, never trained on;
- ``[bfcl]``: BFCL single-turn categories evaluated at every stage through ``dsv32 eval``'s scorer;
- ``[sft]``, ``[rl]`` (the sections of the post-training recipe; ``[rl]``'s settings are those of both
  GRPO arms, whose environments the recipe sets itself), ``[rl_model]``, ``report_to``, ``out_dir``.

A split that would train on a held-out domain is refused here (:class:`~dsv32.recipe.RecipeError`);
the synthesized set's own check (:func:`~dsv32.synth.programmatic.check_disjoint`, no held-out table or
tool name in training) runs again on the task files before the model loads.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from dsv32.envs.general.tasks import TASK_SETS as GENERAL_SETS
from dsv32.envs.interpreter.env import SYSTEM_PROMPTS
from dsv32.envs.interpreter.tasks import GENERATORS as CODE_CATEGORIES
from dsv32.eval.bfcl.single import GRADED as BFCL_GRADED
from dsv32.posttrain.recipe import ProofTop, RLModel, refuse_shared
from dsv32.recipe import (
    Checked,
    RecipeError,
    Rule,
    at_least,
    build_section,
    check_fields,
    check_sections,
    each,
    in_range,
    one_of,
)
from dsv32.rl.agentic.config import AgenticConfig
from dsv32.synth.programmatic.domains import DOMAIN_NAMES
from dsv32.synth.programmatic.split import DomainSplit, SplitError, split_domains
from dsv32.train.sft.config import SFTConfig

SECTIONS = ("out_dir", "report_to", "synth", "code", "general", "bfcl", "sft", "rl", "rl_model")
#: The files the run writes into its root before the model loads.
SYNTH_TRAIN, SYNTH_RL, SYNTH_HELDOUT = "synth_train.jsonl", "synth_rl.jsonl", "synth_heldout.jsonl"
CODE_TRAIN, CODE_RL, CODE_HELDOUT = "code_train.jsonl", "code_rl.jsonl", "code_heldout.jsonl"
SYNTH_ENV, CODE_ENV, GENERAL_ENV = "synth-general", "code-interpreter", "general-tools"
DEFAULT_OUT = "runs/posttrain-transfer"


@dataclass
class SynthSection(Checked):
    """``[synth]``: ``envs`` programmatic environments of ``seed`` with ``tasks_per_env`` tasks each,
    split by domain — ``heldout_domains`` (empty: ``heldout_fraction`` of the vocabulary, drawn with
    the seed) are never trained on; ``train_domains`` (empty: every other domain) are what the cold
    start and GRPO draw from. The cold start replays the first ``coldstart`` training tasks; GRPO draws
    from the training tasks after them; every stage is evaluated on the first ``heldout`` held-out
    tasks (0: all of them), of which there must be at least ``min_heldout``. ``eval_batch``: how
    many greedy episodes of a suite run at once (each holds its KV cache between its model calls)."""

    RANGES: ClassVar[dict] = {
        "envs": at_least(1),
        "seed": at_least(0),
        "tasks_per_env": in_range(1, 4),
        "heldout_domains": each(one_of(*DOMAIN_NAMES)),
        "heldout_fraction": Rule(lambda v: 0 < v < 1, "in (0, 1)"),
        "train_domains": each(one_of(*DOMAIN_NAMES)),
        "coldstart": at_least(1),
        "heldout": at_least(0),
        "min_heldout": at_least(1),
        "workers": at_least(1),
        "eval_batch": at_least(1),
        "call_timeout_s": Rule(lambda v: v > 0, "> 0"),
    }

    envs: int = 600
    seed: int = 0
    tasks_per_env: int = 2
    heldout_domains: list[str] = field(default_factory=list)
    heldout_fraction: float = 0.2
    train_domains: list[str] = field(default_factory=list)
    coldstart: int = 32
    heldout: int = 200
    min_heldout: int = 1
    workers: int = 1
    eval_batch: int = 50
    call_timeout_s: float = 20.0

    def __post_init__(self) -> None:
        super().__post_init__()
        shared = sorted(set(self.train_domains) & set(self.heldout_domains))
        if shared:
            raise RecipeError(
                f"[synth] train_domains and heldout_domains share {shared}: a held-out domain is never "
                "trained on; take them out of one side"
            )

    def split(self) -> DomainSplit:
        """The domain split (pure: nothing is drawn but the held-out domains); a ``train_domains`` entry
        on the held-out side is refused."""
        try:
            drawn = split_domains(
                DOMAIN_NAMES,
                heldout=self.heldout_domains or None,
                fraction=self.heldout_fraction,
                seed=self.seed,
            )
        except SplitError as err:
            raise RecipeError(f"[synth] {err}") from None
        held = sorted(set(self.train_domains) & set(drawn.heldout))
        if held:
            raise RecipeError(
                f"[synth] train_domains {held} are held out (the split holds out {', '.join(drawn.heldout)}); "
                "a held-out domain is never trained on"
            )
        train = tuple(d for d in drawn.train if not self.train_domains or d in self.train_domains)
        return DomainSplit(train, drawn.heldout)


@dataclass
class CodeSection(Checked):
    """``[code]``: generated code-interpreter tasks (``categories``, ``difficulty``; 0 cycles 1..5) —
    ``train`` of seed 0, whose first ``coldstart`` join the cold start and the rest are the code-only
    arm's GRPO tasks, and ``heldout`` of seed 1 (never a training prompt), the arms' in-domain check
    (0: none). ``system_prompt``: the interpreter's own (``full`` or ``short``)."""

    RANGES: ClassVar[dict] = {
        "train": at_least(2),
        "coldstart": at_least(0),
        "heldout": at_least(0),
        "difficulty": in_range(0, 5),
        "categories": each(one_of(*CODE_CATEGORIES)),
        "system_prompt": one_of(*SYSTEM_PROMPTS),
    }

    train: int = 64
    coldstart: int = 16
    heldout: int = 40
    difficulty: int = 0
    categories: list[str] = field(default_factory=lambda: ["chain"])
    system_prompt: str = "short"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.coldstart >= self.train:
            raise RecipeError(
                f"[code] coldstart = {self.coldstart} leaves none of the {self.train} training tasks for GRPO"
            )


@dataclass
class GeneralSection(Checked):
    """``[general]``: the ``general-tools`` task sets ``sets`` (the hand-written trip, inventory and
    calendar generators), the first ``tasks`` of them in order (0: all), evaluated at every stage."""

    RANGES: ClassVar[dict] = {"sets": each(one_of(*GENERAL_SETS)), "tasks": at_least(0)}

    sets: list[str] = field(default_factory=lambda: ["heldout"])
    tasks: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.sets:
            raise RecipeError(f"[general] sets is empty; name at least one of {', '.join(GENERAL_SETS)}")


@dataclass
class BFCLSection(Checked):
    """``[bfcl]``: the first ``per_category`` entries of each BFCL single-turn category in
    ``categories``, greedy, at most ``max_tokens`` new tokens a reply, ``batch_size`` replies at once,
    scored by BFCL's own AST checker through ``dsv32 eval``."""

    RANGES: ClassVar[dict] = {
        "categories": each(one_of(*BFCL_GRADED)),
        "per_category": at_least(1),
        "max_tokens": at_least(1),
        "batch_size": at_least(1),
    }

    categories: list[str] = field(default_factory=lambda: ["simple_python", "multiple", "parallel"])
    per_category: int = 134
    max_tokens: int = 160
    batch_size: int = 32

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.categories or len(set(self.categories)) != len(self.categories):
            raise RecipeError(f"[bfcl] categories must name distinct categories, got {self.categories}")


@dataclass
class TransferRecipe:
    path: str
    root: Path
    synth: SynthSection
    code: CodeSection
    general: GeneralSection
    bfcl: BFCLSection
    sft: SFTConfig
    rl: AgenticConfig
    rl_code: AgenticConfig
    rl_model: RLModel
    split: DomainSplit

    @property
    def trackers(self) -> tuple[str, ...]:
        return self.sft.report_to, self.rl.rl.report_to, self.rl_code.rl.report_to

    @property
    def prompt(self) -> str:
        """The system prompt of every stage (``rl.agentic.prompt``): the cold start, both arms, the
        evaluations."""
        return self.rl.agentic.prompt

    def code_tasks(self) -> tuple[list, list]:
        """The code-interpreter training tasks (seed 0) and held-out ones (seed 1; none when
        ``code.heldout`` is 0), no held-out prompt a training prompt."""
        from dsv32.envs.interpreter import generate

        c, cats = self.code, tuple(self.code.categories)
        d = c.difficulty or None
        train = generate(c.train, seed=0, difficulty=d, categories=cats, prefix="train")
        heldout = (
            generate(c.heldout, seed=1, difficulty=d, categories=cats, prefix="heldout") if c.heldout else []
        )
        refuse_shared(train, heldout, "[code] held-out")
        return train, heldout


def is_transfer_recipe(data: dict[str, Any]) -> bool:
    """Whether a post-training recipe is the transfer recipe (it has ``[synth]``)."""
    return "synth" in data


def read_transfer_recipe(path: str | Path, overrides: list[str], out: str | None = None) -> TransferRecipe:
    """Read and check every section (nothing is synthesized, loaded or written); ``out`` replaces
    ``out_dir``."""
    from dsv32.recipe import read_recipe
    from dsv32.rl.agentic.config import agentic_config_from_dict
    from dsv32.train.sft.config import sft_config_from_dict

    path = str(path)
    data = read_recipe(path, overrides)
    check_sections(data, SECTIONS)
    root = Path(out or data.get("out_dir", DEFAULT_OUT))
    synth = build_section(SynthSection, data.get("synth", {}), "synth")
    split = synth.split()
    code = build_section(CodeSection, data.get("code", {}), "code")
    general = build_section(GeneralSection, data.get("general", {}), "general")
    bfcl = build_section(BFCLSection, data.get("bfcl", {}), "bfcl")
    top = check_fields(ProofTop, {k: v for k, v in data.items() if k == "report_to"}, "top level")
    report_to = top.get("report_to", ProofTop.report_to)
    sft_data = {"report_to": report_to, **data.get("sft", {})}
    sft = sft_config_from_dict(
        {**sft_data, "out_dir": str(root / "sft"), "data": {**sft_data.get("data", {}), "path": path}}, "sft"
    )
    rl_data = {"report_to": report_to, **data.get("rl", {})}
    if "envs" in rl_data:
        raise RecipeError(
            "[rl] envs: the transfer recipe sets the environments of its two GRPO arms itself "
            f"({SYNTH_ENV} on [synth]'s training domains, {CODE_ENV} on [code]'s tasks); remove [[rl.envs]]"
        )
    synth_env = {"name": SYNTH_ENV, "tasks": str(root / SYNTH_RL), "eval_tasks": "",
                 "options": {"call_timeout_s": synth.call_timeout_s}}  # fmt: skip
    code_env = {"name": CODE_ENV, "tasks": str(root / CODE_RL), "eval_tasks": "",
                "options": {"system_prompt": code.system_prompt}}  # fmt: skip
    rl = agentic_config_from_dict({**rl_data, "envs": [synth_env], "out_dir": str(root / "rl")}, "rl")
    rl_code = agentic_config_from_dict(
        {**rl_data, "envs": [code_env], "out_dir": str(root / "rl_code")}, "rl"
    )
    for cfg in (rl, rl_code):
        cfg.agentic.eval_tasks = 0  # the run evaluates every stage itself
        cfg.rl.policy.name = str(root / "sft" / "model")
    rl_model = build_section(RLModel, data.get("rl_model", {}), "rl_model")
    return TransferRecipe(path, root, synth, code, general, bfcl, sft, rl, rl_code, rl_model, split)


def section_dict(recipe: TransferRecipe) -> dict[str, Any]:
    """The recipe's own sections as plain data (the report states them)."""
    return {
        "synth": asdict(recipe.synth),
        "code": asdict(recipe.code),
        "general": asdict(recipe.general),
        "bfcl": asdict(recipe.bfcl),
        "split": {"train": list(recipe.split.train), "heldout": list(recipe.split.heldout)},
    }
