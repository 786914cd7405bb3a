"""Rewards for mixed RL (paper §3).

Reasoning and agent tasks: a rule-based outcome reward (:func:`math_reward`, :func:`exact_match_reward`,
:func:`format_reward`), a length penalty (:func:`length_penalty`) and a language-consistency reward
(:func:`language_consistency`). General tasks: a generative reward model that grades each response
against its prompt's rubric (:class:`GenerativeRewardModel`). :func:`compose_rewards` combines them
per domain with the weights of a :class:`RewardSpec`.

Modules: ``outcome`` (answers and format; the boxed answer and math equality with a timeout that
works in any thread come from :mod:`dsv32.envs.mathcheck`, shared with the environments and the
evaluation harness), ``shaping`` (length, language), ``judge`` (the generative RM), ``compose`` (per domain).
Pure Python: no torch.
"""

from dsv32.envs.mathcheck import answers_equal
from dsv32.rl.grpo.rewards.compose import (
    COMPONENTS,
    RewardFunction,
    RewardResult,
    RewardSample,
    RewardSpec,
    compose_rewards,
    default_reward_specs,
)
from dsv32.rl.grpo.rewards.judge import (
    DEFAULT_RUBRIC,
    GenerativeRewardModel,
    JudgeError,
    Judgement,
    JudgeStats,
    RewardModelError,
    parse_score,
)
from dsv32.rl.grpo.rewards.outcome import (
    answer_part,
    exact_match_reward,
    extract_boxed,
    final_answer,
    format_reward,
    math_reward,
    normalize_answer,
)
from dsv32.rl.grpo.rewards.shaping import (
    LENGTH_SHAPES,
    char_script,
    dominant_scripts,
    language_consistency,
    length_penalty,
)

__all__ = [
    "COMPONENTS",
    "DEFAULT_RUBRIC",
    "LENGTH_SHAPES",
    "GenerativeRewardModel",
    "JudgeError",
    "JudgeStats",
    "Judgement",
    "RewardFunction",
    "RewardModelError",
    "RewardResult",
    "RewardSample",
    "RewardSpec",
    "answer_part",
    "answers_equal",
    "char_script",
    "compose_rewards",
    "default_reward_specs",
    "dominant_scripts",
    "exact_match_reward",
    "extract_boxed",
    "final_answer",
    "format_reward",
    "language_consistency",
    "length_penalty",
    "math_reward",
    "normalize_answer",
    "parse_score",
]
