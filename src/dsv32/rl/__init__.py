"""Stable GRPO as in DeepSeek-V3.2 (paper §3, §3.1).

- :mod:`~dsv32.rl.grpo.loss` — the objective as pure functions: :func:`grpo_loss` (clipped ratio, unbiased
  KL of Eq. 7, Off-Policy Sequence Mask of Eq. 9), :func:`group_advantages`, :func:`token_logprobs`
  (Keep Sampling Mask, training side);
- :mod:`~dsv32.rl.grpo.rewards` — rule-based outcome, format, length, language consistency, generative RM;
- :mod:`~dsv32.rl.grpo.tasks` — prompt sources (procedural arithmetic, JSONL) and the domain mix;
- :mod:`~dsv32.rl.grpo.policy` / :mod:`~dsv32.rl.grpo.rollout` — the model being trained and its batched
  rollouts (sampling log-probs, kept sets, Keep Routing, a multi-turn hook);
- :mod:`~dsv32.rl.grpo.update` — the mini-batch updates of one rollout batch (:func:`grpo_update`);
- :mod:`~dsv32.rl.grpo.trainer` — the loop: :func:`train_grpo` (``dsv32 rl train``);
- :mod:`~dsv32.rl.engines` — where rollouts are sampled (in process, or a remote HTTP engine with
  file weight sync and weight versions); :mod:`~dsv32.rl.agentic.fanout` — environment episodes on threads
  or Ray actors.
"""

from dsv32.rl.grpo.config import (
    GRPOConfig,
    PolicyConfig,
    RLConfig,
    RLConfigError,
    SourceConfig,
    load_rl_config,
)
from dsv32.rl.grpo.loss import (
    OutputTotals,
    group_advantages,
    grpo_loss,
    kept_log_mass,
    sequence_kl_coefs,
    token_logprobs,
)
from dsv32.rl.grpo.rollout import Rollouts, SamplingConfig, rollout

__all__ = [
    "GRPOConfig",
    "OutputTotals",
    "PolicyConfig",
    "RLConfig",
    "RLConfigError",
    "Rollouts",
    "SamplingConfig",
    "SourceConfig",
    "group_advantages",
    "grpo_loss",
    "kept_log_mass",
    "load_rl_config",
    "rollout",
    "sequence_kl_coefs",
    "token_logprobs",
]
