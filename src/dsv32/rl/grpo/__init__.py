"""GRPO as in DeepSeek-V3.2 (paper §3.1): the objective, its updates, the policy, prompt sources,
rewards, rollouts and the trainer every kind of GRPO run shares.

- :mod:`~dsv32.rl.grpo.loss` — the objective as pure functions (Eq. 5–9);
- :mod:`~dsv32.rl.grpo.update` — the mini-batch updates of one rollout batch;
- :mod:`~dsv32.rl.grpo.policy` / :mod:`~dsv32.rl.grpo.rollout` — the model being trained and its
  batched rollouts (sampling log-probs, kept sets, Keep Routing);
- :mod:`~dsv32.rl.grpo.tasks` / :mod:`~dsv32.rl.grpo.rewards` — prompt sources and rewards;
- :mod:`~dsv32.rl.grpo.trainer` — :class:`GRPOTrainer`, built once from a recipe, whose step is one
  code path with an overridable ``rollout(step)``; single-turn prompts are its first kind.
"""
