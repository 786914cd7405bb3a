"""What several RL tests share: a recipe whose one task source is a JSONL file they write, and a
trivially learnable task: the letter reward on toy prompts."""

from __future__ import annotations

import json

from dsv32.rl.grpo.config import load_rl_config
from dsv32.rl.grpo.rewards import RewardResult
from dsv32.rl.grpo.tasks import Task


def jsonl_recipe(tmp_path, rows: list[dict], sets: list[str], *, name: str = "toy", domain: str = "toy"):
    """An RL recipe (``sets``: dotted overrides; ``out_dir`` is ``tmp_path/run``) whose task source is
    ``tmp_path/<name>.jsonl`` holding ``rows`` (task ids are ``<name>-<line>``), of domain ``domain``."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    cfg = load_rl_config(None, [f"out_dir={tmp_path / 'run'}", *sets])
    cfg.sources[0].kind, cfg.sources[0].path, cfg.sources[0].domain = "jsonl", str(path), domain
    return cfg


#: The toy prompts of the letter reward (domain ``toy``).
LETTER_TASKS = [Task(id=f"t{i}", domain="toy", prompt=p) for i, p in enumerate(["ab", "xyz", "hello", "q"])]


class LetterReward:
    """Share of the first 8 generated characters that are lowercase ASCII letters (about 1 in 10 for a
    random byte model): trivially learnable."""

    def score_many(self, samples, max_workers=1):
        out = []
        for s in samples:
            share = sum("a" <= ch <= "z" for ch in s.completion[:8]) / 8
            out.append(RewardResult(total=share, components={"letter": share}, correct=share >= 0.5))
        return out


def letter_recipe(tmp_path, policy: str = "tiny-llama", **over):
    """A GRPO recipe on :data:`LETTER_TASKS` (4 prompts × 4 outputs a step, 2 mini-batches, 8 new
    tokens at temperature 1, no held-out problems); ``over``: dotted overrides."""
    sets = [
        f"policy.name={policy}",
        "grpo.prompts_per_step=4",
        "grpo.group_size=4",
        "grpo.mini_batches=2",
        "grpo.micro_batch=4",
        "grpo.lr=3e-3",
        "sampling.max_new_tokens=8",
        "sampling.temperature=1.0",
        "eval.problems=0",
    ]
    rows = [{"prompt": t.prompt, "domain": "toy"} for t in LETTER_TASKS]
    return jsonl_recipe(tmp_path, rows, [*sets, *[f"{k}={v}" for k, v in over.items()]])
