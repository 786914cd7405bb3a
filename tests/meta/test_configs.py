"""Every config with ``RANGES`` checks them however it is built: from a recipe (``dsv32.recipe``) or
in Python (``recipe.Checked``), with the package's own typed error."""

import ast
from pathlib import Path

import pytest

from dsv32.dsa.hf import DSAConfig, DSAError
from dsv32.recipe import Checked
from dsv32.rl.grpo.config import GRPOConfig, RLConfigError, SourceConfig
from dsv32.train.dsa.config import DataConfig, StageConfig, TrainConfigError
from dsv32.train.sft import SFTConfigError, SFTTrainConfig

SRC = Path(__file__).resolve().parents[2] / "src" / "dsv32"


def test_every_class_with_ranges_derives_from_checked():
    missing = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ClassDef) or node.name == "Checked":
                continue
            has_ranges = any(
                isinstance(stmt, ast.AnnAssign | ast.Assign)
                and "RANGES"
                in ast.unparse(stmt.target if isinstance(stmt, ast.AnnAssign) else stmt.targets[0])
                for stmt in node.body
            )
            if has_ranges and "Checked" not in {ast.unparse(b) for b in node.bases}:
                missing.append(f"{path.relative_to(SRC)}::{node.name}")
    assert not missing, f"derive these from dsv32.recipe.Checked: {missing}"


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda: StageConfig(lr=-1.0), TrainConfigError, "StageConfig.lr = -1.0: must be > 0"),
        (lambda: StageConfig(stage="late"), TrainConfigError, "StageConfig.stage = \"late\": must be one of"),
        (lambda: StageConfig(steps="many"), TrainConfigError, "StageConfig.steps = \"many\": must be an integer, >= 1"),
        (lambda: GRPOConfig(clip_eps=1.5), RLConfigError, "GRPOConfig.clip_eps = 1.5: must be in (0, 1)"),
        (lambda: GRPOConfig(group_size=1), RLConfigError, "GRPOConfig.group_size = 1: must be >= 2"),
        (lambda: SourceConfig(weight=0), RLConfigError, "SourceConfig.weight = 0: must be > 0"),
        (lambda: DSAConfig(index_topk=0), DSAError, "DSAConfig.index_topk = 0: must be >= 1"),
        (lambda: SFTTrainConfig(lr=0.0), SFTConfigError, "SFTTrainConfig.lr = 0.0: must be > 0"),
    ],
)  # fmt: skip
def test_configs_built_in_python_are_range_checked(build, error, message):
    with pytest.raises(error) as info:
        build()
    assert str(info.value).startswith(message)


def test_defaults_and_cross_field_checks_still_apply():
    assert StageConfig(stage="sparse").lr == 7.3e-6  # the default is filled in before the check
    with pytest.raises(TrainConfigError, match="replay > 1 needs a frozen model"):
        StageConfig(stage="sparse", replay=2)
    with pytest.raises(RLConfigError, match="not divisible by mini_batches"):
        GRPOConfig(prompts_per_step=3, group_size=3, mini_batches=2)
    assert isinstance(GRPOConfig(), Checked) and DSAConfig(mode="sparse").mode == "sparse"
    # rules that look at the disk wait for the recipe reader: a default may name a file made later
    assert DataConfig(source="/not/yet/made").source == "/not/yet/made"
