"""From a recipe's ``[rewards]`` tables to the reward function the loop calls, and scoring a batch.

``[rewards.<domain>]`` tables override the built-in specs of :func:`default_reward_specs` (``math``,
``exact``, ``general``) or add domains; ``[rewards.judge]`` configures the generative reward model
for ``grm`` components: ``base_url`` + ``model`` (+ ``api_key_env``) for any OpenAI-compatible
endpoint, or ``local = "<policy name>"`` for a local model judged through :func:`local_judge`.
Without a judge, domains that need one are left out (and a task of such a domain is an error).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from dsv32.rl.rewards import (
    GenerativeRewardModel,
    RewardFunction,
    RewardResult,
    RewardSample,
    RewardSpec,
    compose_rewards,
    default_reward_specs,
)


def local_judge(policy, max_new_tokens: int = 512) -> Callable[[list[dict]], str]:
    """A judge callable over a local :class:`~dsv32.rl.policy.Policy` (greedy, its chat template)."""
    from dsv32.engine import generate

    def judge(messages: list[dict]) -> str:
        template = getattr(policy.tokenizer, "chat_template", None)
        if template:
            text = policy.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        else:
            text = "\n\n".join(m["content"] for m in messages) + "\n"
        with torch.no_grad():
            out = generate(
                policy.model,
                [policy.encode(text)],
                max_new_tokens=max_new_tokens,
                temperature=0.0,
                eos_token_id=policy.eos_token_id,
                pad_token_id=policy.pad_token_id,
            )
        return policy.decode(out.tokens[0, : int(out.lengths[0])])

    return judge


def build_reward_fn(
    tables: dict[str, dict[str, Any]], *, max_tokens: int, thinking: bool = False
) -> RewardFunction:
    specs = default_reward_specs(max_tokens=max_tokens, thinking=thinking)
    tables = dict(tables)
    judge_cfg = tables.pop("judge", None)
    for domain, table in tables.items():
        if not isinstance(table, dict):
            raise ValueError(f"[rewards.{domain}] must be a table")
        specs[domain] = RewardSpec.from_dict({"max_tokens": max_tokens, "thinking": thinking} | table)
    grm = None
    if judge_cfg:
        judge_cfg = dict(judge_cfg)
        local = judge_cfg.pop("local", None)
        key_env = judge_cfg.pop("api_key_env", "OPENAI_API_KEY")
        if local:
            from dsv32.rl.policy import load_policy

            grm = GenerativeRewardModel(judge=local_judge(load_policy(local)), **judge_cfg)
        else:
            grm = GenerativeRewardModel(api_key=os.environ.get(key_env), **judge_cfg)
    else:
        specs = {d: s for d, s in specs.items() if "grm" not in s.weights}
    return compose_rewards(specs, grm)


def score(reward_fn: RewardFunction, batch, max_workers: int = 1) -> list[RewardResult]:
    """Rewards of every row of a :class:`~dsv32.rl.rollout.Rollouts`."""
    samples = [
        RewardSample(
            domain=task.domain,
            prompt=task.prompt,
            completion=text,
            num_completion_tokens=n,
            answer=task.answer,
            rubric=task.rubric,
        )
        for task, text, n in zip(batch.tasks, batch.completions, batch.num_tokens)
    ]
    return reward_fn.score_many(samples, max_workers=max_workers)
