"""The post-training recipe (``configs/posttrain-smollm2.toml``), read and checked as one for
``dsv32 posttrain proof`` and ``dsv32 posttrain rl``:

- ``[tasks]``: generated code-interpreter problems, training (seed 0) and held-out (seed 1, never a
  training prompt), and the system prompt of every stage;
- ``[sft]``: the cold-start SFT recipe (the sections of ``dsv32 sft``);
- ``[rl]``: the agentic GRPO recipe (the sections of a ``dsv32 posttrain rl`` recipe); its
  ``[[rl.envs]]`` train on the generated training tasks and evaluate on the held-out ones;
- ``out_dir``: the run's root: ``tasks_train.jsonl``, ``tasks_heldout.jsonl``, ``sft/``, ``rl/``.

The policy of ``[rl]`` is the SFT stage's output (``out_dir/sft/model``) unless ``rl.policy.name``
names another.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from dsv32.chat.templates import EPISODE_PROMPTS
from dsv32.recipe import Checked, RecipeError, at_least, build_section, check_sections, each, in_range, one_of
from dsv32.rl.agentic_config import AgenticConfig
from dsv32.train.sft_config import SFTConfig

SECTIONS = ("out_dir", "tasks", "sft", "rl")
TRAIN_FILE, HELDOUT_FILE = "tasks_train.jsonl", "tasks_heldout.jsonl"
DEFAULT_RECIPE = Path(__file__).resolve().parents[1] / "configs" / "posttrain-smollm2.toml"


@dataclass
class ProofTasks(Checked):
    """``[tasks]`` of the post-training recipe: generated code-interpreter problems (training: seed
    0; held-out: seed 1, never a training prompt), and the system prompt of every stage."""

    RANGES: ClassVar[dict] = {
        "train": at_least(1),
        "heldout": at_least(1),
        "difficulty": in_range(1, 5),
        "categories": each(one_of("multiplication", "modular", "combinatorics", "linear_system")),
        "prompt": one_of(*EPISODE_PROMPTS),
    }

    train: int = 64
    heldout: int = 32
    difficulty: int = 1
    categories: list[str] = field(default_factory=lambda: ["multiplication"])
    prompt: str = "bare"


@dataclass
class PosttrainRecipe:
    path: str
    root: Path
    tasks: ProofTasks
    sft: SFTConfig
    rl: AgenticConfig

    @property
    def train_file(self) -> Path:
        return self.root / TRAIN_FILE

    @property
    def heldout_file(self) -> Path:
        return self.root / HELDOUT_FILE

    def generate_tasks(self) -> tuple[list, list]:
        """The training and held-out tasks (the same every time: seeds 0 and 1); a held-out prompt
        that is also a training prompt is refused."""
        from dsv32.envs.interpreter import generate

        t, cats = self.tasks, tuple(self.tasks.categories)
        train = generate(t.train, seed=0, difficulty=t.difficulty, categories=cats, prefix="train")
        heldout = generate(t.heldout, seed=1, difficulty=t.difficulty, categories=cats, prefix="heldout")
        overlap = {x.prompt for x in train} & {x.prompt for x in heldout}
        if overlap:
            raise RecipeError(
                f"held-out tasks repeat {len(overlap)} training prompt(s); change the task counts"
            )
        return train, heldout

    def write_tasks(self, train: list, heldout: list) -> None:
        from dsv32.envs.base import save_tasks

        save_tasks(train, self.train_file)
        save_tasks(heldout, self.heldout_file)


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
    from dsv32.rl.agentic_config import agentic_config_from_dict
    from dsv32.train.sft_config import sft_config_from_dict

    path = str(path or DEFAULT_RECIPE)
    data = read_recipe(path, overrides)
    check_sections(data, SECTIONS)
    root = Path(out or data.get("out_dir", "runs/posttrain"))
    tasks = build_section(ProofTasks, {**asdict(ProofTasks()), **data.get("tasks", {})}, "tasks")
    sft_data = data.get("sft", {})
    sft = sft_config_from_dict(
        {**sft_data, "out_dir": str(root / "sft"), "data": {**sft_data.get("data", {}), "path": path}}, "sft"
    )
    rl_data = dict(data.get("rl", {}))
    envs = rl_data.get("envs", [{"name": "code-interpreter"}])
    if isinstance(envs, list) and all(isinstance(e, dict) for e in envs):  # else refused as it is
        files = {"tasks": str(root / TRAIN_FILE), "eval_tasks": str(root / HELDOUT_FILE)}
        envs = [{**e, **files} for e in envs]
    rl = agentic_config_from_dict({**rl_data, "envs": envs, "out_dir": str(root / "rl")}, "rl")
    rl.agentic.prompt = tasks.prompt
    policy = rl_data.get("policy")
    if not (isinstance(policy, dict) and policy.get("name")):
        rl.rl.policy.name = str(root / "sft" / "model")
    return PosttrainRecipe(path, root, tasks, sft, rl)
