"""What a GRPO step produced, and its metrics record: one function for every kind of rollout, so a
single-turn run and an agentic run log the same keys with the same meaning.

A step's outputs o_i (a single-turn sample or a whole agentic episode) are :class:`Output` rows;
:func:`step_record` gathers them over the ranks in the step's order and summarises them with the
optimizer steps' own metrics (:func:`dsv32.rl.grpo.update.grpo_update`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dsv32 import distributed
from dsv32.rl.grpo.rollout import Rollouts


@dataclass
class Output:
    """One output o_i of a step, as the metrics see it.

    ``key``: its place in the step (item ``k``'s ``j``-th output is ``k·G + j``); ``reward`` the
    total reward (as the float32 the advantages were computed from); ``scored``: False when the
    reward could not be computed (a failed judge request or environment verdict: no advantage);
    ``correct``: the outcome (None: the domain has none); ``truncated``: cut short (a token budget,
    or an episode that stopped without an answer); ``episode``: an agentic episode's
    ``steps`` and ``tool_call_valid`` (None for a single-turn sample)."""

    key: int
    reward: float
    advantage: float
    scored: bool
    correct: bool | None
    domain: str
    truncated: bool
    components: dict[str, float] = field(default_factory=dict)
    episode: dict | None = None


@dataclass
class StepSamples:
    """A step's rollouts as the update takes them: ``batch`` (one row per single-turn sample, one
    or more rows per episode), ``advantages`` ``[B]`` per row, ``outputs`` (this rank's, any order),
    ``sequence_ids`` ``[B]`` each row's output key when an output spans several rows (None: every
    row is an output of its own, in the order of the keys), ``staleness`` per sampled row or call."""

    batch: Rollouts
    advantages: torch.Tensor
    outputs: list[Output]
    sequence_ids: torch.Tensor | None = None
    staleness: list[int] = field(default_factory=list)


def step_record(
    step: int,
    lr: float,
    outputs: list[Output],
    row_tokens: list[int],
    updates: list[dict],
    group_size: int,
    extra: dict,
) -> dict:
    """The metrics of step ``step`` (0-based; logged as ``step + 1``) from this rank's ``outputs``
    and generated tokens per row ``row_tokens``, gathered over the ranks, and its optimizer steps'
    ``updates``. ``extra``: this rank's counters to sum (``judge_*``) and timings to keep as they are.
    Means over rewards count scored outputs only; the first update's numbers stand apart, as it is
    on-policy and shows the training/inference mismatch alone."""
    parts = distributed.all_gather_objects((outputs, row_tokens))
    outs = sorted((o for p in parts for o in p[0]), key=lambda o: o.key)
    lengths = [n for p in parts for n in p[1]]
    scored = [o for o in outs if o.scored]
    real = torch.tensor([o.reward for o in scored], dtype=torch.float32)
    correct = [o.correct for o in scored if o.correct is not None]
    groups = torch.tensor([o.advantage for o in outs]).view(-1, group_size)
    record = {
        "step": step + 1,
        "lr": lr,
        "reward_mean": float(real.mean()) if len(real) else float("nan"),
        "reward_std": float(real.std()) if len(real) > 1 else 0.0,
        "accuracy": sum(correct) / len(correct) if correct else float("nan"),
        "zero_adv_groups": float((groups == 0).all(-1).float().mean()),
        "unscored": len(outs) - len(scored),
        "rows": len(lengths),
        "length_mean": sum(lengths) / len(lengths),
        "length_max": max(lengths),
        "truncated_frac": sum(o.truncated for o in outs) / len(outs),
    }
    record |= extra
    episodes = [o.episode for o in outs if o.episode is not None]
    if episodes:
        record["tool_call_valid"] = sum(e["tool_call_valid"] for e in episodes) / len(episodes)
        record["mean_steps"] = sum(e["steps"] for e in episodes) / len(episodes)
    record["reward_by_domain"] = mean_by_domain([o.domain for o in scored], [o.reward for o in scored])
    components: dict[str, list[float]] = {}
    for o in scored:
        for k, v in o.components.items():
            components.setdefault(k, []).append(v)
    record["reward_components"] = {k: sum(v) / len(v) for k, v in components.items()}
    return record | update_record(updates)


def update_record(updates: list[dict]) -> dict:
    """The optimizer steps' metrics: their means (:func:`update_means`), the first update's ratio
    and mismatch (on-policy: π_θ = π_old) and the later ones' (off-policy) apart."""
    first, later = updates[0], updates[1:]
    record = update_means(updates)
    record["first_update_ratio_mean"] = first["ratio_mean"]
    record["first_update_log_ratio_sampling"] = first["log_ratio_sampling"]
    record["first_update_abs_log_ratio"] = first["abs_log_ratio"]
    if later:
        means = _mean(later)
        record["later_updates_ratio_mean"] = means["ratio_mean"]
        record["later_updates_abs_log_ratio"] = means["abs_log_ratio"]
    return record


def mean_by_domain(domains: list[str], rewards: list[float]) -> dict[str, float]:
    """The mean reward of each domain (rows ``domains[i]``, ``rewards[i]``)."""
    by_domain: dict[str, list[float]] = {}
    for d, r in zip(domains, rewards):
        by_domain.setdefault(d, []).append(r)
    return {d: sum(v) / len(v) for d, v in by_domain.items()}


def update_means(updates: list[dict]) -> dict:
    """The step's means over the updates that were applied (over all when none was), and the number
    of updates skipped for a non-finite loss or gradient."""
    applied = [u for u in updates if not u.get("skipped_updates")]
    return _mean(applied or updates) | {"skipped_updates": sum(u.get("skipped_updates", 0) for u in updates)}


def _mean(records: list[dict]) -> dict:
    keys = {k for r in records for k in r}
    return {k: sum(r[k] for r in records if k in r) / sum(1 for r in records if k in r) for k in keys}
