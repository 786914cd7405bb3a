"""RL prompt sources (procedural arithmetic, JSONL, the domain mix) and the GRPO recipe."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dsv32.rl.grpo.config import RLConfigError, load_rl_config
from dsv32.rl.grpo.tasks import ArithmeticWordProblems, JsonlTasks, MixedTasks, Task, TaskError

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


class _Numbered:
    def __init__(self, name: str, size: int) -> None:
        self.name, self.size = name, size

    def get(self, i: int):
        return Task(id=f"{self.name}{i % self.size}", domain="toy", prompt=str(i))


def test_each_source_of_a_mix_gives_every_item_once_before_wrapping_and_any_step_is_reproducible():
    mix = MixedTasks([(_Numbered("a", 10), 1.0), (_Numbered("b", 10), 1.0)], seed=0)
    drawn = [t.id for step in range(5) for t in mix.sample(step, 4)]
    for name in "ab":
        mine = [i for i in drawn if i.startswith(name)]
        assert mine == [f"{name}{k}" for k in range(len(mine))]  # in order, none skipped or repeated
    fresh = MixedTasks([(_Numbered("a", 10), 1.0), (_Numbered("b", 10), 1.0)], seed=0)
    assert [t.id for t in fresh.sample(3, 4)] == drawn[12:16]  # a resumed run draws the same
    assert [t.id for t in mix.sample(1, 4)] == drawn[4:8]  # also going back


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


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"prompt": "1+1?", "answer": [2]}, "'answer' must be a string or a number"),
        ({"prompt": "1+1?", "answer": False}, "'answer' must be a string or a number"),
        ({"prompt": "1+1?", "domain": ["math"]}, "'domain' must be a string"),
        ({"prompt": "1+1?", "rubric": {"a": 1}}, "'rubric' must be a string"),
        ({"prompt": "1+1?", "system": 5}, "'system' must be a string, got 5"),
        ({"prompt": "1+1?", "id": [1]}, "'id' must be a string or an integer"),
        ({"prompt": ""}, "needs a non-empty string 'prompt'"),
    ],
)
def test_jsonl_task_fields_of_the_wrong_type_name_file_and_line(tmp_path, row, message):
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"prompt": "ok"}) + "\n\n" + json.dumps(row) + "\n")
    with pytest.raises(TaskError, match=re.escape(f"tasks.jsonl:3: {message}")):
        JsonlTasks(str(path))


def test_every_task_is_checked_against_the_rewards_before_the_policy_loads(tmp_path, monkeypatch):
    import dsv32.rl.grpo.single_turn as trainer
    from dsv32.rl.grpo.config import rl_config_from_dict

    def no_model(*args, **kwargs):
        raise AssertionError("the policy loaded before the tasks were checked")

    monkeypatch.setattr(trainer, "load_policy", no_model)
    path = tmp_path / "tasks.jsonl"
    rows = [{"prompt": "1+1?", "answer": 2, "domain": "math"}, {"prompt": "2+2?", "domain": "exact"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "out"
    cfg = rl_config_from_dict({"out_dir": str(out), "sources": [{"kind": "jsonl", "path": str(path)}]})
    with pytest.raises(TaskError, match=r"tasks\.jsonl:2: domain 'exact' is scored against a reference"):
        trainer.train_grpo(cfg, progress=False)
    path.write_text(json.dumps({"prompt": "Write a haiku."}) + "\n")  # 'general' needs a judge
    with pytest.raises(TaskError, match=r"tasks\.jsonl:1: domain 'general' .* add \[rewards\.judge\]"):
        trainer.train_grpo(cfg, progress=False)
    cfg.rewards = {"math": {"weights": {"math": 1.0}, "foo": 1}}
    with pytest.raises(RLConfigError, match=r"\[rewards\.math\] unknown RewardSpec keys \['foo'\]"):
        trainer.train_grpo(cfg, progress=False)
    assert not out.exists()


def test_reward_setup_keeps_judged_domains_only_with_a_judge():
    from dsv32.rl.grpo.rewards.setup import reward_setup
    from dsv32.rl.grpo.tasks import Task

    plain = reward_setup({}, max_tokens=64)
    assert sorted(plain.specs) == ["exact", "math"] and plain.unjudged == ("general",)
    judged = reward_setup({"judge": {"local": "tiny-llama", "scale": 5}}, max_tokens=64)
    assert "general" in judged.specs
    assert judged.task_problem(Task("t", "general", "Write a haiku.")) is None
    assert "no reward" in judged.task_problem(Task("t", "mth", "1+1?", answer="2"))
    with pytest.raises(RLConfigError, match=r"\[rewards\.judge\] scale must be > 0"):
        reward_setup({"judge": {"local": "tiny-llama", "scale": 0}}, max_tokens=64)


def test_a_rollout_temperature_the_engine_decodes_greedily_is_refused():
    """The engine is greedy below 1e-5, where the loss's logits / T would not be what was sampled."""
    from dsv32.recipe import RecipeError
    from dsv32.rl.grpo.rollout import SamplingConfig

    with pytest.raises(RecipeError, match=r"temperature = 1e-06: must be 0 \(greedy\) or >= 1e-05"):
        SamplingConfig(temperature=1e-6)
    assert SamplingConfig(temperature=0.0).temperature == 0.0
    assert SamplingConfig(temperature=1e-5).temperature == 1e-5


@pytest.mark.parametrize("betas", [[0.9], [0.9, 0.99, 0.999], [0.9, 1.0]])
def test_grpo_betas_are_two_numbers_in_0_1(betas):
    from dsv32.rl.grpo.config import GRPOConfig

    with pytest.raises(RLConfigError, match="betas"):
        GRPOConfig(betas=betas)


def test_env_options_are_checked_against_the_environment_when_the_recipe_is_read():
    from dsv32.rl.agentic.config import agentic_config_from_dict

    cfg = agentic_config_from_dict({"envs": [{"name": "code-interpreter", "options": {"cell_timeout_s": 5}}]})
    assert cfg.envs[0].options == {"cell_timeout_s": 5}
    with pytest.raises(RLConfigError, match=r"\[envs\.0\] options = \{\"foo\": 1\}: environment"):
        agentic_config_from_dict({"envs": [{"name": "code-interpreter", "options": {"foo": 1}}]})


@pytest.mark.parametrize("answer", ["", "   ", "\n"])
def test_an_empty_reference_answer_is_a_missing_answer(tmp_path, answer):
    from dsv32.rl.grpo.rewards.setup import reward_setup

    setup = reward_setup({}, max_tokens=64)
    path = tmp_path / "emptyans.jsonl"
    rows = [{"prompt": "Capital of France?", "answer": "Paris"}, {"prompt": "Capital?", "answer": answer}]
    path.write_text("".join(json.dumps(r | {"domain": "exact"}) + "\n" for r in rows))
    with pytest.raises(TaskError, match=r"emptyans\.jsonl:2: domain 'exact' is scored against a reference"):
        JsonlTasks(str(path), check=setup.task_problem)
    assert "non-empty 'answer'" in setup.task_problem(Task("t", "math", "2+3?", answer=answer))
