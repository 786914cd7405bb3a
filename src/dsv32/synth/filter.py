"""Difficulty filtering by pass@k of a target policy (paper §3.2.3: keep tasks with non-zero pass@100).

For each task the policy runs ``n ≥ k`` independent episodes in the task's environment; ``c`` of them
are solved (reward ≥ ``success``). The unbiased estimator of pass@k (Chen et al., 2021) is

    pass@k = 1 − C(n − c, k) / C(n, k) = 1 − ∏_{i = n − c + 1}^{n} (1 − k / i)     (1 when n − c < k)

A task is dropped when the policy never solves it (``c = 0`` ⇔ pass@k = 0: too hard, or broken) and,
with ``drop_solved``, when it always solves it (``c = n`` ⇔ pass@1 = 1: nothing left to learn). The
report gives the distribution of pass@1 = c / n and of pass@k over every task scored.

``stop_early`` ends a task's sampling at its first success when always-solved tasks are kept — the
keep/drop decision is then the same at a fraction of the cost, but ``c`` and the pass@k values of kept
tasks are lower bounds, and the report says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dsv32.agent import run_episode
from dsv32.envs.base import Environment, Task
from dsv32.synth.records import JobFailed, Pricing, SynthError
from dsv32.synth.runner import Item, JobResult

BINS = 10


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from ``c`` successes in ``n`` samples (see the module docstring)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise SynthError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@dataclass
class FilterConfig:
    """``k`` of pass@k (paper: 100); ``n`` samples per task (default ``k``, at least ``k``)."""

    k: int = 100
    n: int | None = None
    drop_solved: bool = False
    stop_early: bool = False
    success: float = 1.0
    max_steps: int = 20
    thinking: bool = True
    sampling: dict = field(default_factory=dict)
    seed: int | None = None

    def __post_init__(self) -> None:
        self.n = self.k if self.n is None else self.n
        for name in ("k", "n", "max_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise SynthError(f"{name} must be an integer, got {value!r}")
        if self.max_steps < 1:
            raise SynthError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.k < 1 or self.n < self.k:
            raise SynthError(f"pass@k needs k >= 1 and n >= k samples per task, got k={self.k}, n={self.n}")
        if self.stop_early and self.drop_solved:
            raise SynthError("stop_early cannot tell always-solved tasks apart; drop it or drop drop_solved")
        if not 0 < self.success <= 1:
            raise SynthError(f"success threshold must be in (0, 1], got {self.success}")


def score_task(
    backend: Any,
    make_env: Callable[[], Environment],
    task: Task,
    config: FilterConfig,
    key: str,
    pricing: Pricing | None = None,
    *,
    retry_errors: bool = True,
) -> JobResult:
    """Run the policy ``n`` times on ``task``; keep or drop it (see the module docstring).

    An episode whose backend failed (``stop_reason == "error"``: an endpoint that kept failing after
    its retries) scores nothing about the policy, so with ``retry_errors`` it raises
    :class:`JobFailed` with the tokens spent so far: the job is logged as an error (its usage
    counted in the run's totals), committed as nothing, and runs again on the next run. Without it
    (a local model, whose only backend failure is a conversation that fills its window: the same on
    every run) such an episode counts as not solved.

    An episode the environment could not score (its reset, tools or reward failed: ``reward.scored``
    is False) is a broken task, the same on every run: the task is dropped as ``broken task`` (the
    failure in ``detail``) at once, without more samples."""
    result = JobResult(key)
    usage = result.usage.role("policy", pricing)
    rewards: list[float] = []
    stops: dict[str, int] = {}
    for i in range(config.n or config.k):
        sampling = dict(config.sampling)
        if config.seed is not None:
            sampling["seed"] = config.seed + i
        with make_env() as env:
            trajectory, reward = run_episode(
                backend, env, task, max_steps=config.max_steps, thinking=config.thinking, sampling=sampling
            )
        usage.add_trajectory(trajectory)
        broken = None if reward.scored else reward.reason.removeprefix("not scored: ")
        # run_episode's error is the environment's note alone when only the environment failed
        if retry_errors and trajectory.stop_reason == "error" and trajectory.error != broken:
            raise JobFailed(
                f"task {task.id!r}: sample {i + 1} got no answer from the policy: {trajectory.error}",
                result.usage,
            )
        if broken is not None:
            result.stats = {"task": task.id, "n": i + 1, "broken": broken}
            result.dropped.append({"reason": "broken task", "task": task.id, "detail": broken})
            return result
        stops[trajectory.stop_reason] = stops.get(trajectory.stop_reason, 0) + 1
        rewards.append(reward.value)
        if config.stop_early and reward.value >= config.success:
            break
    n, c = len(rewards), sum(r >= config.success for r in rewards)
    stats = {
        "task": task.id,
        "n": n,
        "c": c,
        "pass@1": c / n,
        f"pass@{config.k}": pass_at_k(n, c, config.k) if n >= config.k else None,
        "stopped_early": n < (config.n or config.k),
        "rewards": rewards,
        "stop_reasons": stops,
    }
    result.stats = stats
    if c == 0:
        result.dropped.append({"reason": f"pass@{config.k} = 0 (never solved)", "task": task.id})
    elif config.drop_solved and c == n:
        result.dropped.append({"reason": "always solved (pass@1 = 1)", "task": task.id})
    else:
        row = task.to_dict()
        row["info"] = {
            **row["info"],
            "filter": {k_: stats[k_] for k_ in ("n", "c", "pass@1", f"pass@{config.k}")},
        }
        result.items.append(Item(row, f"{task.id}\n{task.prompt}"))
    return result


def distribution(rows: list[dict], k: int) -> dict:
    """Counts over scored tasks: pass@1 in ``BINS`` equal bins (the last one closed), tasks never
    solved, always solved, kept; mean pass@1 and pass@k; and the broken tasks, which are not scored."""
    stats = [r["stats"] for r in rows if r.get("status") != "error" and "pass@1" in r.get("stats", {})]
    bins = [0] * BINS
    for s in stats:
        bins[min(int(s["pass@1"] * BINS), BINS - 1)] += 1
    at_k = [s[f"pass@{k}"] for s in stats if s.get(f"pass@{k}") is not None]
    return {
        "tasks": len(stats),
        "kept": sum(len(r.get("kept", [])) for r in rows),
        "never_solved": sum(s["c"] == 0 for s in stats),
        "broken": sum("broken" in r.get("stats", {}) for r in rows if r.get("status") != "error"),
        "always_solved": sum(s["c"] == s["n"] and not s["stopped_early"] for s in stats),
        "mean_pass@1": round(sum(s["pass@1"] for s in stats) / len(stats), 4) if stats else None,
        f"mean_pass@{k}": round(sum(at_k) / len(at_k), 4) if at_k else None,
        "pass@1_histogram": {f"{i / BINS:.1f}-{(i + 1) / BINS:.1f}": b for i, b in enumerate(bins)},
        "lower_bounds": any(s["stopped_early"] for s in stats),
    }


def report_markdown(dist: dict, k: int, title: str) -> str:
    lines = [f"# pass@{k} filter: {title}", ""]
    lines += [f"- tasks scored: {dist['tasks']}, kept: {dist['kept']}"]
    lines += [
        f"- never solved (pass@{k} = 0): {dist['never_solved']}, always solved: {dist['always_solved']}"
    ]
    means = [f"mean pass@1: {dist['mean_pass@1']}"]
    if k > 1:
        means.append(f"mean pass@{k}: {dist[f'mean_pass@{k}']}")
    lines += ["- " + ", ".join(means)]
    if dist["broken"]:
        lines += [f"- broken tasks (the environment could not score them, dropped): {dist['broken']}"]
    if dist["lower_bounds"]:
        lines += ["- sampling stopped at the first success for some tasks: their values are lower bounds"]
    lines += ["", "| pass@1 | tasks |", "|---|---|"]
    lines += [f"| {b} | {n} |" for b, n in dist["pass@1_histogram"].items()]
    return "\n".join(lines) + "\n"
