"""A prompt that, with the generation budget, does not fit the model's window is refused by name."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from helpers.rl import jsonl_recipe

from dsv32.rl.grpo.policy import load_policy
from dsv32.rl.grpo.rewards import RewardResult
from dsv32.rl.grpo.rollout import SamplingConfig, rollout
from dsv32.rl.grpo.single_turn import evaluate, train_grpo
from dsv32.rl.grpo.tasks import Task, TaskError

LONG = "What is 2+3? " + "blah " * 300  # ~1500 tokens of tiny-llama's byte vocabulary; window 1024


class Zero:
    def score_many(self, samples, max_workers=1):
        return [RewardResult(total=0.0) for _ in samples]


@pytest.fixture(scope="module")
def policy():
    return load_policy("tiny-llama", device="cpu")


def test_rollout_and_evaluation_refuse_a_prompt_past_the_window(policy):
    tasks = [Task("short", "math", "2+3?", answer="5"), Task("too-long", "math", LONG, answer="5")]
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=4, max_total_tokens=4)
    with pytest.raises(TaskError, match=r"task 'too-long' .* > the model's window of 1024 tokens"):
        rollout(policy, tasks, 2, sampling, generator=torch.Generator().manual_seed(0))
    with pytest.raises(TaskError, match="task 'too-long'"):
        evaluate(policy, tasks, Zero(), max_new_tokens=4, batch_size=2)
    fits = Task("edge", "math", "x" * 100)  # a prompt that fits but not with a huge budget
    with pytest.raises(TaskError, match=r"task 'edge'.*up to 1000 are generated"):
        rollout(policy, [fits], 1, SamplingConfig(max_new_tokens=1000, max_total_tokens=1000))


def test_a_task_file_with_a_prompt_past_the_window_stops_the_run_before_step_one(tmp_path, policy):
    rows = [{"prompt": "hi", "domain": "toy"}, {"prompt": LONG}]
    cfg = jsonl_recipe(tmp_path, rows, ["eval.problems=0", "grpo.steps=1"], name="long")
    with pytest.raises(TaskError, match=r"task 'long-2'"):
        train_grpo(cfg, policy=policy, reward_fn=Zero(), progress=False)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
