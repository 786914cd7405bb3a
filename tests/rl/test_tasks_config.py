"""RL prompt sources (procedural arithmetic, JSONL, the domain mix) and the GRPO recipe."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dsv32.rl.config import RLConfigError, load_rl_config
from dsv32.rl.tasks import ArithmeticWordProblems, JsonlTasks, MixedTasks, TaskError

ROOT = Path(__file__).resolve().parents[2]


def _solve(question: str) -> int:
    """An independent solver for the templates: read the numbers and the verbs."""
    nums = [int(x) for x in re.findall(r"\d+", question)]
    if "gave away" in question:
        return nums[0] - nums[1]
    if "in each" in question:
        return nums[0] * nums[1]
    if "gives" in question:
        return nums[0] + nums[1] - nums[2]
    return nums[0] + nums[1]


def test_arithmetic_problems_are_correct_deterministic_and_split():
    train = ArithmeticWordProblems(seed=3)
    again = ArithmeticWordProblems(seed=3)
    held = ArithmeticWordProblems(seed=3, split="eval")
    tasks = train.take(300)
    assert [t.prompt for t in tasks] == [t.prompt for t in again.take(300)]
    for t in tasks + held.take(100):
        question = t.prompt.split("\n")[0]
        assert t.prompt.endswith("put your final answer within \\boxed{}.")
        assert int(t.answer) == _solve(question) >= 0, t.prompt
        assert t.domain == "math"
    eval_questions = {t.prompt for t in held.take(train.eval_size)}
    assert not eval_questions & {t.prompt for t in train.take(2000)}
    kinds = {("gave away" in t.prompt, "in each" in t.prompt, "gives" in t.prompt) for t in tasks}
    assert len(kinds) == 4  # every template appears
    assert [t.prompt for t in ArithmeticWordProblems(seed=4).take(20)] != [t.prompt for t in tasks[:20]]
    with pytest.raises(TaskError, match="unknown arithmetic kinds"):
        ArithmeticWordProblems(kinds=("divide",))
    brief = ArithmeticWordProblems(seed=3, template="brief").get(0)
    assert brief.answer == tasks[0].answer and brief.prompt.split("\n")[0] == tasks[0].prompt.split("\n")[0]
    assert "\\boxed{5}" in brief.system and brief.prompt.endswith("final number in \\boxed{}.")
    assert tasks[0].system is None
    with pytest.raises(TaskError, match="unknown template"):
        ArithmeticWordProblems(template="cot")


def test_jsonl_tasks_and_errors(tmp_path):
    path = tmp_path / "tasks.jsonl"
    rows = [
        {"question": "What is 2+2?", "answer": 4, "domain": "math"},
        {"prompt": "Write a haiku about rain.", "rubric": "5-7-5 syllables; mentions rain"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    src = JsonlTasks(str(path))
    a, b = src.get(0), src.get(1)
    assert a.domain == "math" and a.answer == "4" and "\\boxed{}" in a.prompt
    assert b.domain == "general" and b.rubric.startswith("5-7-5") and b.answer is None
    assert src.get(2) == a  # wraps around
    path.write_text('{"text": "no prompt"}\n')
    with pytest.raises(TaskError, match="prompt"):
        JsonlTasks(str(path))
    path.write_text("not json\n")
    with pytest.raises(TaskError, match="not JSON"):
        JsonlTasks(str(path))


def test_mixture_follows_weights_and_never_repeats_within_a_source(tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"p{i}"}) for i in range(10_000)))
    mix = MixedTasks([(ArithmeticWordProblems(seed=0), 3.0), (JsonlTasks(str(path)), 1.0)], seed=1)
    drawn = [t for step in range(50) for t in mix.sample(step, 8)]
    share = sum(t.domain == "math" for t in drawn) / len(drawn)
    assert 0.65 < share < 0.85
    ids = [t.id for t in drawn]
    assert len(ids) == len(set(ids))
    assert [t.id for t in mix.sample(7, 8)] == [t.id for t in mix.sample(7, 8)]


def test_rl_recipes_load_and_validate(tmp_path):
    for path in sorted((ROOT / "configs").glob("rl-*.toml")):
        cfg = load_rl_config(path)
        assert cfg.grpo.group_size >= 2, path
    cfg = load_rl_config(
        None,
        [
            "grpo.steps=3",
            "grpo.opsm_delta=0.5",
            "sampling.top_p=0.9",
            "grpo.domain_kl_coef={math = 0.0, general = 0.01}",
        ],
    )
    assert cfg.grpo.steps == 3 and cfg.grpo.opsm_delta == 0.5 and cfg.sampling.top_p == 0.9
    assert cfg.grpo.domain_kl_coef == {"math": 0.0, "general": 0.01}
    with pytest.raises(RLConfigError, match="unknown keys"):
        load_rl_config(None, ["grpo.stepz=3"])
    with pytest.raises(RLConfigError, match="group_size"):
        load_rl_config(None, ["grpo.group_size=1"])
    with pytest.raises(RLConfigError, match="divisible"):
        load_rl_config(None, ["grpo.prompts_per_step=3", "grpo.group_size=3", "grpo.mini_batches=2"])
    with pytest.raises(RLConfigError, match="old_logprobs"):
        load_rl_config(None, ["grpo.old_logprobs=fresh"])
    bad = tmp_path / "bad.toml"
    bad.write_text("[grpo\n")
    with pytest.raises(RLConfigError, match="not valid TOML"):
        load_rl_config(bad)
