"""The post-training recipe (``configs/posttrain-smollm2.toml``), read and checked as one for
``dsv32 posttrain proof`` and ``dsv32 posttrain rl``:

- ``[tasks]``: generated code-interpreter problems, training (seed 0), held-out (seed 1) and, for
  the SFT stage's held-out loss, validation (seed 2) — no held-out or validation prompt is a
  training prompt — the share of the training tasks the cold start replays, and the system prompt
  of every stage;
- ``[sft]``: the cold-start SFT recipe (the sections of ``dsv32 sft``);
- ``[rl]``: the agentic GRPO recipe (the sections of a ``dsv32 posttrain rl`` recipe); its
  ``[[rl.envs]]`` train on the generated training tasks and evaluate on the held-out ones;
- ``[rl_model]`` (optional): what GRPO trains of the SFT model (``train_embeddings``);
- ``[transfer]`` (optional): an environment the policy never trains on, evaluated greedily at every
  stage (report only);
- ``out_dir``: the run's root: ``tasks_train.jsonl``, ``tasks_heldout.jsonl``,
  ``tasks_validation.jsonl``, ``tasks_rl.jsonl`` and ``tasks_rl_solved.jsonl`` (the proof's GRPO
  pool, with ``rl_pool = "unsolved"``), ``sft/``, ``rl/``;
- ``report_to``: the experiment trackers of the SFT and GRPO stages (:mod:`dsv32.trackers`; each
  stage writes under its own ``trackers/``), unless ``[sft]`` or ``[rl]`` names its own.

The policy of ``[rl]`` is the SFT stage's output (``out_dir/sft/model``) unless ``rl.policy.name``
names another.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from dsv32.chat.templates import EPISODE_PROMPTS
from dsv32.envs.interpreter.env import SYSTEM_PROMPTS
from dsv32.envs.interpreter.tasks import GENERATORS as CATEGORIES
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
from dsv32.trackers import REPORT_TO
from dsv32.train.sft.config import SFTConfig

SECTIONS = ("out_dir", "report_to", "tasks", "sft", "rl", "rl_model", "transfer")
TRAIN_FILE, HELDOUT_FILE, VALIDATION_FILE, RL_POOL_FILE = (
    "tasks_train.jsonl",
    "tasks_heldout.jsonl",
    "tasks_validation.jsonl",
    "tasks_rl.jsonl",
)
RL_SOLVED_FILE = "tasks_rl_solved.jsonl"
#: ``[tasks] rl_pool``: every training task, or those the SFT model does not solve greedily
RL_POOLS = ("all", "unsolved")
DEFAULT_RECIPE = Path(__file__).resolve().parents[1] / "configs" / "posttrain-smollm2.toml"


@dataclass
class ProofTasks(Checked):
    """``[tasks]`` of the post-training recipe: generated code-interpreter problems (training: seed
    0; held-out: seed 1; validation: seed 2, never a training prompt), how many of the training tasks
    the cold start replays (``coldstart``; 0: all of them), and the system prompt of every stage
    (``prompt``, and the interpreter's own ``system_prompt``: ``full`` or ``short``).
    ``difficulty`` 0 cycles the difficulties 1..5 through the tasks. ``rl_pool`` is what GRPO draws
    from in the proof: ``all`` the training tasks, or the ``unsolved`` ones — those the cold-start
    model does not solve greedily (one greedy pass over the training tasks after SFT: the usual
    pass-rate filter before RL; a task the SFT model already solves teaches GRPO little), with
    ``rl_pool_solved`` of each step's tasks (in expectation) still drawn from the solved ones: their
    groups are what keeps a question GRPO is learning from spreading to the questions SFT solved.
    ``curve``: the held-out curve during GRPO (``rl.eval.every``) is measured on the first ``curve``
    held-out tasks (0, or fewer held-out tasks: all of them); its step-0 and last points are the SFT
    and GRPO evaluations counted over the same tasks."""

    RANGES: ClassVar[dict] = {
        "train": at_least(1),
        "heldout": at_least(1),
        "validation": at_least(0),
        "coldstart": at_least(0),
        "difficulty": in_range(0, 5),
        "categories": each(one_of(*CATEGORIES)),
        "prompt": one_of(*EPISODE_PROMPTS),
        "system_prompt": one_of(*SYSTEM_PROMPTS),
        "rl_pool": one_of(*RL_POOLS),
        "rl_pool_solved": Rule(lambda v: 0 <= v < 1, "in [0, 1)"),
        "curve": at_least(0),
    }

    train: int = 64
    heldout: int = 32
    validation: int = 0
    coldstart: int = 0
    difficulty: int = 1
    categories: list[str] = field(default_factory=lambda: ["multiplication"])
    prompt: str = "bare"
    system_prompt: str = "full"
    rl_pool: str = "all"
    rl_pool_solved: float = 0.0
    curve: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.coldstart > self.train:
            raise RecipeError(
                f"[tasks] coldstart = {self.coldstart} is more than the {self.train} training tasks"
            )

    @property
    def curve_tasks(self) -> int:
        """How many held-out tasks (the first ones) the held-out curve during GRPO counts: ``curve``,
        all of them when there are fewer (a smaller ``heldout`` for a quick run) or ``curve`` is 0."""
        return min(self.curve, self.heldout) if self.curve else self.heldout

    @property
    def env_options(self) -> dict[str, Any]:
        """The options of every code-interpreter environment of the run."""
        return {"system_prompt": self.system_prompt}


@dataclass
class RLModel(Checked):
    """``[rl_model]``: what GRPO trains of the SFT stage's in-memory model. It keeps the SFT stage's
    frozen lower layers (``sft.train.freeze_layers``); ``train_embeddings = false`` also keeps the
    token embeddings (and the output head tied to them) as SFT left them: on a 135M model whose
    head is its embedding matrix, Adam's first steps move all 49k rows at once, and the backward
    pass then stops at the lowest trained layer."""

    RANGES: ClassVar[dict] = {}

    train_embeddings: bool = True


@dataclass
class ProofTransfer(Checked):
    """``[transfer]``: ``tasks`` tasks of environment ``env``'s task set ``set`` (the first ones), run
    greedily at every stage with ``prompt`` and at most ``max_steps`` model calls — an environment the
    policy never trains on, reported as it is."""

    RANGES: ClassVar[dict] = {
        "env": Rule(bool, "an environment name"),
        "tasks": at_least(1),
        "prompt": one_of(*EPISODE_PROMPTS),
        "max_steps": at_least(1),
    }

    env: str = "general-tools"
    set: str = "heldout"
    tasks: int = 8
    prompt: str = "env"
    max_steps: int = 4


@dataclass
class ProofTop(Checked):
    """The recipe's top-level ``report_to`` (checked like a section)."""

    RANGES: ClassVar[dict] = {"report_to": REPORT_TO}

    report_to: str = "none"


@dataclass
class PosttrainRecipe:
    path: str
    root: Path
    tasks: ProofTasks
    sft: SFTConfig
    rl: AgenticConfig
    transfer: ProofTransfer | None = None
    rl_model: RLModel = field(default_factory=RLModel)

    @property
    def trackers(self) -> tuple[str, str]:
        """The ``report_to`` of the SFT and the GRPO stage."""
        return self.sft.report_to, self.rl.rl.report_to

    @property
    def train_file(self) -> Path:
        return self.root / TRAIN_FILE

    @property
    def heldout_file(self) -> Path:
        return self.root / HELDOUT_FILE

    @property
    def validation_file(self) -> Path:
        return self.root / VALIDATION_FILE

    def generate_tasks(self) -> tuple[list, list]:
        """The training and held-out tasks (the same every time: seeds 0 and 1); a held-out prompt
        that is also a training prompt is refused."""
        from dsv32.envs.interpreter import generate

        t, cats = self.tasks, tuple(self.tasks.categories)
        d = t.difficulty or None
        train = generate(t.train, seed=0, difficulty=d, categories=cats, prefix="train")
        heldout = generate(t.heldout, seed=1, difficulty=d, categories=cats, prefix="heldout")
        refuse_shared(train, heldout, "held-out")
        return train, heldout

    def validation_tasks(self, train: list) -> list:
        """The SFT stage's validation tasks (seed 2; none when ``tasks.validation`` is 0), checked to
        share no prompt with training."""
        from dsv32.envs.interpreter import generate

        t = self.tasks
        if not t.validation:
            return []
        val = generate(
            t.validation,
            seed=2,
            difficulty=t.difficulty or None,
            categories=tuple(t.categories),
            prefix="val",
        )
        refuse_shared(train, val, "validation")
        return val

    def coldstart_tasks(self, train: list) -> list:
        """The training tasks the cold start replays: the first ``tasks.coldstart`` (0: all)."""
        return train[: self.tasks.coldstart or len(train)]

    def use_rl_pool(self, train: list, solved_ids: set[str]) -> dict[str, Any]:
        """GRPO draws from the ``train`` tasks not in ``solved_ids`` (``tasks_rl.jsonl``; all of them
        when every task is solved) and ``tasks.rl_pool_solved`` of its tasks from the solved ones
        (``tasks_rl_solved.jsonl``: the same environment, weight share / (1 − share), no held-out
        set); returns the pool's summary for the report."""
        from dsv32.envs.base import save_tasks

        pool = [t for t in train if t.id not in solved_ids] or train  # all solved: nothing to filter on
        solved = [t for t in train if t.id in solved_ids] if len(pool) < len(train) else []
        share = self.tasks.rl_pool_solved if solved else 0.0
        save_tasks(pool, self.root / RL_POOL_FILE)
        if share:
            save_tasks(solved, self.root / RL_SOLVED_FILE)
        for e in list(self.rl.envs):
            if e.tasks == str(self.train_file):
                e.tasks = str(self.root / RL_POOL_FILE)
                if share:
                    weight = e.weight * share / (1 - share)
                    extra = replace(e, tasks=str(self.root / RL_SOLVED_FILE), eval_tasks="", weight=weight)
                    self.rl.envs.append(extra)
        return {"rule": "unsolved", "train": len(train), "solved_by_sft": len(solved_ids),
                "pool": len(pool), "solved_share": share}  # fmt: skip

    def write_tasks(self, train: list, heldout: list, validation: list | None = None) -> None:
        from dsv32.envs.base import save_tasks

        save_tasks(train, self.train_file)
        save_tasks(heldout, self.heldout_file)
        if validation:
            save_tasks(validation, self.validation_file)


def refuse_shared(train: list, other: list, what: str) -> None:
    """A ``what`` task whose prompt is also a training prompt is refused."""
    overlap = {x.prompt for x in train} & {x.prompt for x in other}
    if overlap:
        raise RecipeError(f"{what} tasks repeat {len(overlap)} training prompt(s); change the task counts")


def is_posttrain_recipe(data: dict[str, Any]) -> bool:
    """Whether a recipe is the post-training recipe (it has ``[tasks]``, ``[sft]`` or ``[rl]``) rather
    than an agentic GRPO recipe of its own."""
    return any(key in data for key in ("tasks", "sft", "rl"))


def read_posttrain_recipe(
    path: str | Path | None, overrides: list[str], out: str | None = None
) -> PosttrainRecipe:
    """Read and check every section (nothing is loaded or written); ``path`` None: the shipped
    recipe; ``out`` replaces ``out_dir``."""
    from dsv32.recipe import read_recipe
    from dsv32.rl.agentic.config import agentic_config_from_dict
    from dsv32.train.sft.config import sft_config_from_dict

    path = str(path or DEFAULT_RECIPE)
    data = read_recipe(path, overrides)
    check_sections(data, SECTIONS)
    root = Path(out or data.get("out_dir", "runs/posttrain"))
    tasks = build_section(ProofTasks, {**asdict(ProofTasks()), **data.get("tasks", {})}, "tasks")
    top = check_fields(ProofTop, {k: v for k, v in data.items() if k == "report_to"}, "top level")
    report_to = top.get("report_to", ProofTop.report_to)
    sft_data = {"report_to": report_to, **data.get("sft", {})}
    sft = sft_config_from_dict(
        {**sft_data, "out_dir": str(root / "sft"), "data": {**sft_data.get("data", {}), "path": path}}, "sft"
    )
    rl_data = {"report_to": report_to, **data.get("rl", {})}
    envs = rl_data.get("envs", [{"name": "code-interpreter"}])
    if isinstance(envs, list) and all(isinstance(e, dict) for e in envs):  # else refused as it is
        files = {"tasks": str(root / TRAIN_FILE), "eval_tasks": str(root / HELDOUT_FILE)}
        envs = [
            {**e, **files, "options": {**tasks.env_options, **(e.get("options") or {})}}
            if e.get("name", "code-interpreter") == "code-interpreter"
            else {**e, **files}
            for e in envs
        ]
    rl = agentic_config_from_dict({**rl_data, "envs": envs, "out_dir": str(root / "rl")}, "rl")
    rl.agentic.prompt = tasks.prompt
    policy = rl_data.get("policy")
    if not (isinstance(policy, dict) and policy.get("name")):
        rl.rl.policy.name = str(root / "sft" / "model")
    transfer = None
    if "transfer" in data:
        transfer = build_section(ProofTransfer, data["transfer"], "transfer")
        check_transfer(transfer)
    rl_model = build_section(RLModel, data.get("rl_model", {}), "rl_model")
    return PosttrainRecipe(path, root, tasks, sft, rl, transfer, rl_model)


def check_transfer(t: ProofTransfer) -> None:
    """The transfer environment is registered, is not the trained one, and has the task set named."""
    from dsv32.envs.base import EnvError, get_env

    try:
        spec = get_env(t.env)
    except EnvError as err:
        raise RecipeError(f"[transfer] env = {t.env!r}: {err}") from None
    if t.env == "code-interpreter":
        raise RecipeError(
            "[transfer] env must be an environment the policy does not train on, not code-interpreter"
        )
    if t.set not in spec.task_sets:
        raise RecipeError(
            f"[transfer] set = {t.set!r}: {t.env} has the task sets {', '.join(spec.task_sets)}"
        )
