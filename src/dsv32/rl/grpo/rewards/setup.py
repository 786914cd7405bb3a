"""From a recipe's ``[rewards]`` tables to the reward function the loop calls, and scoring a batch.

``[rewards.<domain>]`` tables override the built-in specs of :func:`default_reward_specs` (``math``,
``exact``, ``general``) or add domains; ``[rewards.judge]`` configures the generative reward model
for ``grm`` components: ``base_url`` + ``model`` (+ ``api_key_env``) for any OpenAI-compatible
endpoint, or ``local = "<policy name>"`` for a local model judged through :func:`local_judge`.
Without a judge, domains that need one are left out (and a task of such a domain is an error).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dsv32.rl.grpo.config import RLConfigError
from dsv32.rl.grpo.rewards import (
    GenerativeRewardModel,
    RewardFunction,
    RewardResult,
    RewardSample,
    RewardSpec,
    compose_rewards,
    default_reward_specs,
)
from dsv32.rl.grpo.rewards.compose import OUTCOME_COMPONENTS
from dsv32.rl.grpo.tasks import Task


def local_judge(policy, max_new_tokens: int = 512) -> Callable[[list[dict]], str]:
    """A judge callable over a local :class:`~dsv32.rl.grpo.policy.Policy` (greedy, its chat template)."""
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


# [rewards.judge] keys besides GenerativeRewardModel's own: a local policy's name, the API key's variable
JUDGE_KEYS = {"local", "api_key_env"}
_JUDGE_PARAMS = {
    name for name in inspect.signature(GenerativeRewardModel).parameters if name not in ("judge", "api_key")
}


@dataclass
class RewardSetup:
    """A recipe's ``[rewards]`` tables, checked: the reward spec of every domain that is scored, the
    judge's table (None: no judge), and the domains left out because they weight ``grm`` and no judge
    is configured."""

    specs: dict[str, RewardSpec]
    judge: dict[str, Any] | None = None
    unjudged: tuple[str, ...] = ()

    def task_problem(self, task: Task) -> str | None:
        """What stops ``task`` from being scored (its domain has no reward, or it lacks a field that the
        domain's reward reads), or None."""
        spec = self.specs.get(task.domain)
        if spec is None:
            if task.domain in self.unjudged:
                return (
                    f"domain {task.domain!r} is scored by a generative reward model ('grm'), and the recipe "
                    'configures none: add [rewards.judge] (local = "<model>" or base_url + model), or '
                    "give the task a domain with a rule-based reward"
                )
            return f"domain {task.domain!r} has no reward; domains with one: {sorted(self.specs)}"
        needs = [name for name in OUTCOME_COMPONENTS if name in spec.weights]
        if needs and (task.answer is None or not str(task.answer).strip()):
            return (
                f"domain {task.domain!r} is scored against a reference answer ({needs[0]!r} reward): "
                "the task needs a non-empty 'answer'"
            )
        return None


def reward_setup(tables: dict[str, Any], *, max_tokens: int, thinking: bool = False) -> RewardSetup:
    """Check ``[rewards]`` (every ``[rewards.<domain>]`` table a :class:`RewardSpec`, ``[rewards.judge]``
    with known keys and values) without loading anything; a problem raises :class:`RLConfigError`
    naming the table."""
    if not isinstance(tables, dict):
        raise RLConfigError("[rewards] must be a table of per-domain tables")
    specs = default_reward_specs(max_tokens=max_tokens, thinking=thinking)
    tables = dict(tables)
    judge_cfg = tables.pop("judge", None)
    for domain, table in tables.items():
        if not isinstance(table, dict):
            raise RLConfigError(f"[rewards.{domain}] must be a table")
        try:
            spec = {"max_tokens": max_tokens, "thinking": thinking} | table
            specs[domain] = RewardSpec.from_dict(spec, where=f"rewards.{domain}")
        except (TypeError, ValueError) as err:
            message = str(err)  # a recipe check names the table already
            raise RLConfigError(
                message if message.startswith("[") else f"[rewards.{domain}] {message}"
            ) from None
        if specs[domain].rubric_key != "rubric":
            raise RLConfigError(
                f"[rewards.{domain}] rubric_key = {specs[domain].rubric_key!r}: a task's rubric is read "
                "from its 'rubric' field (rubric_key names the field of samples scored through the "
                "library's RewardFunction)"
            )
    if judge_cfg is None:
        unjudged = tuple(sorted(d for d, s in specs.items() if "grm" in s.weights))
        return RewardSetup({d: s for d, s in specs.items() if d not in unjudged}, None, unjudged)
    if not isinstance(judge_cfg, dict):
        raise RLConfigError("[rewards.judge] must be a table")
    unknown = sorted(set(judge_cfg) - JUDGE_KEYS - _JUDGE_PARAMS)
    if unknown:
        raise RLConfigError(
            f"unknown keys in [rewards.judge]: {unknown}; known: {sorted(JUDGE_KEYS | _JUDGE_PARAMS)}"
        )
    for key in ("local", "api_key_env"):
        if key in judge_cfg and not (isinstance(judge_cfg[key], str) and judge_cfg[key]):
            raise RLConfigError(f"[rewards.judge] {key} = {judge_cfg[key]!r}: must be a non-empty string")
    judge = dict(judge_cfg)
    local, _ = judge.pop("local", None), judge.pop("api_key_env", None)
    if bool(local) == ("base_url" in judge):
        raise RLConfigError(
            '[rewards.judge] needs either local = "<model>" (a local judge) or base_url + model (an '
            "OpenAI-compatible server), not " + ("both" if local else "neither")
        )
    try:  # the model's own checks, with a stand-in for the local judge (nothing is loaded or sent)
        GenerativeRewardModel(judge=(lambda messages: "") if local else None, **judge)
    except (TypeError, ValueError) as err:
        raise RLConfigError(f"[rewards.judge] {err}") from None
    return RewardSetup(specs, dict(judge_cfg))


def build_reward_fn(
    tables: dict[str, dict[str, Any]] | RewardSetup, *, max_tokens: int, thinking: bool = False
) -> RewardFunction:
    """The reward function of ``[rewards]`` (or of an already checked :class:`RewardSetup`); a local
    judge is loaded here."""
    setup = (
        tables
        if isinstance(tables, RewardSetup)
        else reward_setup(tables, max_tokens=max_tokens, thinking=thinking)
    )
    grm = None
    if setup.judge is not None:
        judge_cfg = dict(setup.judge)
        local = judge_cfg.pop("local", None)
        key_env = judge_cfg.pop("api_key_env", "OPENAI_API_KEY")
        if local:
            from dsv32.rl.grpo.policy import load_policy

            grm = GenerativeRewardModel(judge=local_judge(load_policy(local)), **judge_cfg)
        else:
            grm = GenerativeRewardModel(api_key=os.environ.get(key_env), **judge_cfg)
    return compose_rewards(setup.specs, grm)


def score(reward_fn: RewardFunction, batch, max_workers: int = 1) -> list[RewardResult]:
    """Rewards of every row of a :class:`~dsv32.rl.grpo.rollout.Rollouts`."""
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


def judge_counts(reward_fn: Any) -> dict[str, int]:
    """The judge's counters (``judge_requests``, ``judge_failures``, ``judge_parse_failures``; zeros
    without a judge) so far: the difference of two is what happened in between."""
    stats = getattr(getattr(reward_fn, "grm", None), "stats", None)
    return {f"judge_{k}": getattr(stats, k, 0) for k in ("requests", "failures", "parse_failures")}
