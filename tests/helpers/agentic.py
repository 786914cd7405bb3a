"""Agentic GRPO on tiny models: the echo environment (registered as ``echo-test`` when this module is
imported, in the test process and in any process that imports it), its tasks and sampling, the tool
user (a tiny model SFT-memorized to call the tool, then answer) and the tests' agentic recipe.

The trained tool user is a session fixture (``trained_tool_user``, ``tool_user``, ``tool_user_dir`` in
``tests/conftest.py``): it is trained once per session."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dsv32.envs.base import Environment, EnvSpec, Reward, Task, register, tool_call, tool_schema
from dsv32.rl.agentic.episodes import EpisodeSettings, episode_rows, rl_task, rows_to_rollouts
from dsv32.rl.grpo.rollout import SamplingConfig


class EchoEnv(Environment):
    """Tool ``f()`` returns ``RESULT-<task id>``; the answer is correct when it is ``5``."""

    name = "echo-test"

    def reset(self, task):
        self.task = task
        return [{"role": "system", "content": "s"}, {"role": "user", "content": task.prompt}]

    def tools(self):
        return [tool_schema("f", "A tool.", {}, [])]

    def call(self, name, arguments):
        return f"RESULT-{self.task.id}" if name == "f" else "error"

    def reward(self, trajectory):
        ok = (trajectory.final or "").strip() == "5"
        return Reward(float(ok), {}, "")

    def reference(self, task):
        return [
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "a",
                "tool_calls": [tool_call("f", {}, "r0")],
            },
            {"role": "assistant", "content": "5", "reasoning_content": "b"},
        ]


TASKS = [Task(f"t{i}", "q", "5", "echo") for i in range(4)]
register(EnvSpec("echo-test", "test env", EchoEnv, {"train": lambda: TASKS, "heldout": lambda: TASKS[:2]}))

SETTINGS = EpisodeSettings(prompt="bare", max_steps=3)
TEMPERATURE = 0.5  # the memorized tiny model garbles the DSML markup at 1.0
SAMPLING = SamplingConfig(temperature=TEMPERATURE, top_p=0.9, top_k=0, max_new_tokens=128)


def memorized(name: str, conversation: list[dict], tmp: Path, steps: int = 60):
    """The tiny model ``name`` taught ``conversation`` by SFT (``steps`` steps at lr 1e-2: memorized),
    as a thinking-mode :class:`~dsv32.rl.grpo.policy.Policy`; trained on one torch thread (the
    trainer records were written so), ``tmp`` holds the SFT run."""
    from dsv32.rl.grpo.policy import Policy
    from dsv32.synth.coldstart import add_reasoning
    from dsv32.train.sft import load_sft_config, train_sft
    from dsv32.train.sft.model import prepare_sft_model

    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "c.jsonl").write_text(json.dumps({"messages": add_reasoning(conversation)}) + "\n")
    sets = [f"model.name={name}", "model.device=cpu", f"data.path={tmp / 'c.jsonl'}", f"train.steps={steps}",
            "train.lr=1e-2", "train.batch_size=1", f"out_dir={tmp / 'sft'}", "data.seq_len=512"]  # fmt: skip
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sm = prepare_sft_model(name, "cpu")
        train_sft(load_sft_config(None, sets), model=sm, progress=False, save_model=False)
    finally:
        torch.set_num_threads(before)
    return Policy(sm.model, sm.tokenizer, sm.kind, thinking=True, source=name)


def train_tool_user(name: str, tmp: Path):
    """The tool user: a tiny model taught (SFT, memorized) to call ``f`` and then answer ``5`` in the
    echo environment, so that its episodes take several model calls."""
    env = EchoEnv()
    msgs = env.reset(TASKS[0])
    reference = env.reference(TASKS[0])
    conv = [*msgs, reference[0], {"role": "tool", "tool_call_id": "r0", "content": "RESULT-t0"}, reference[1]]
    return memorized(name, conv, tmp)


def agentic_config(tmp_path: Path, **over):
    """The tests' agentic GRPO recipe: the echo environment mixed with single-turn arithmetic, 2 steps
    of 2 prompts × 2 outputs, held-out episodes before and after; ``over``: dotted overrides."""
    from dsv32.rl.agentic.config import load_agentic_config

    sets = {
        "out_dir": str(tmp_path / "run"),
        "agentic.prompt": "bare",
        "agentic.max_steps": 3,
        "agentic.eval_tasks": 2,
        "agentic.length_weight": 0.1,
        "agentic.single_turn": True,
        "envs": [{"name": "echo-test", "tasks": "train", "eval_tasks": "heldout", "weight": 3.0}],
        "sources": [{"kind": "arithmetic", "weight": 1.0, "domain": "math"}],
        "grpo.steps": 2,
        "grpo.prompts_per_step": 2,
        "grpo.group_size": 2,
        "grpo.mini_batches": 1,
        "grpo.micro_batch": 8,
        "grpo.lr": 1e-3,
        "grpo.kl_coef": 0.01,
        "grpo.domain_kl_coef": {"math": 0.0},
        "sampling.temperature": TEMPERATURE,
        "sampling.top_p": 0.9,
        "sampling.max_new_tokens": 128,
        "sampling.max_total_tokens": 400,
    } | over
    return load_agentic_config(None, [f"{k}={json.dumps(v)}" for k, v in sets.items()])


def episodes_batch(policy, episodes):
    """The training rows of ``episodes`` (every model call of each) and their rollout batch, with the
    kept sets."""
    rows, tasks = [], []
    for e in episodes:
        for row in episode_rows(e.records):
            rows.append(row)
            tasks.append(rl_task(e))
    return rows, rows_to_rollouts(rows, tasks, policy.pad_token_id, policy.device, with_kept=True)
