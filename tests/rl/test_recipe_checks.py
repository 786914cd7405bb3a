"""An RL recipe's sampling temperature and every value of its [rewards.<domain>] tables are checked
for type and range when the recipe is read, before any model loads."""

from __future__ import annotations

import pytest

from dsv32.recipe import RecipeError
from dsv32.rl.grpo.config import RLConfigError, load_rl_config
from dsv32.rl.grpo.rewards import GenerativeRewardModel, RewardSample, RewardSpec, compose_rewards
from dsv32.rl.grpo.rewards.setup import reward_setup


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"math_timeout_seconds": 0}, "math_timeout_seconds = 0: must be > 0"),
        ({"math_timeout_seconds": -1}, "math_timeout_seconds = -1: must be > 0"),
        ({"thinking": "false"}, 'thinking = "false": must be true or false'),
        ({"require_boxed": "false"}, 'require_boxed = "false": must be true or false'),
        ({"max_tokens": 2.5}, "max_tokens = 2.5: must be an integer"),
        ({"max_tokens": 0}, "max_tokens = 0: must be >= 1"),
        ({"rubric_key": 5}, "rubric_key = 5: must be a string"),
        ({"length_shape": "cubic"}, "length_shape = \"cubic\": must be one of 'overlong', 'linear', 'none'"),
        ({"cache_tokens": -4}, "cache_tokens = -4: must be >= 0"),
    ],
)
def test_a_reward_table_value_of_the_wrong_type_or_range_is_refused_when_read(option, message):
    table = {"weights": {"math": 1.0, "format": 0.1}} | option
    with pytest.raises(RLConfigError, match=r"^\[rewards\.math\] " + message.replace("(", r"\(")):
        reward_setup({"math": table}, max_tokens=64)


def test_a_recipe_rubric_key_other_than_the_task_field_is_refused():
    with pytest.raises(
        RLConfigError, match=r"^\[rewards\.general\] rubric_key = 'criteria': a task's rubric"
    ):
        reward_setup({"general": {"weights": {"grm": 1.0}, "rubric_key": "criteria"}}, max_tokens=64)


def test_a_rubric_key_an_object_sample_lacks_is_an_error_not_the_default_rubric():
    seen = []
    grm = GenerativeRewardModel(judge=lambda messages: seen.append(messages) or "Score: 6/10")
    reward = compose_rewards({"general": RewardSpec({"grm": 1.0}, rubric_key="criteria")}, grm)
    sample = {"domain": "general", "prompt": "q", "completion": "a", "criteria": "Be exact."}
    assert reward(sample).total == pytest.approx(0.6) and "Be exact." in seen[-1][1]["content"]
    with pytest.raises(ValueError, match="rubric_key = 'criteria': the reward sample \\(RewardSample\\)"):
        reward(RewardSample(domain="general", prompt="q", completion="a", rubric="Be exact."))


def test_a_reward_spec_built_in_python_is_checked_too():
    with pytest.raises(RecipeError, match="math_timeout_seconds = 0: must be > 0"):
        RewardSpec({"math": 1.0}, math_timeout_seconds=0)
    with pytest.raises(RecipeError, match='thinking = "no": must be true or false'):
        RewardSpec.from_dict({"weights": {"math": 1.0}, "thinking": "no"})
    assert RewardSpec({"math": 1.0}, math_timeout_seconds=None).math_timeout_seconds is None


@pytest.mark.parametrize("value", ["0", "0.0"])
def test_rl_sampling_needs_a_positive_temperature(tmp_path, value):
    with pytest.raises(RLConfigError, match=r"\[sampling\] temperature = .*must be > 0 for RL"):
        load_rl_config(None, [f"out_dir={tmp_path}", f"sampling.temperature={value}"])
