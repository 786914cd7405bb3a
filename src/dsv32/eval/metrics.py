"""Metrics over per-problem sample scores: pass@1, the unbiased pass@k, confidence intervals.

For a problem with ``n`` samples of which ``c`` are correct (score 1):

- pass@1 = c / n, the mean over samples (scores in [0, 1] average the same way);
- pass@k = 1 - C(n - c, k) / C(n, k) (Chen et al. 2021, the HumanEval paper's unbiased estimator),
  computed as the product 1 - prod_{i = n - c + 1}^{n} (1 - k / i) to stay exact in floating point.

A benchmark's score is the mean over problems of the per-problem value. Its 95 % interval is

- the Wilson score interval when every per-problem value is 0 or 1 (one binary sample each, or
  problems all solved or all failed by every sample): it stays inside [0, 1] and does not collapse
  at 0 % or 100 % the way the normal interval does;
- otherwise the normal interval over problems, mean ± 1.96 · s / sqrt(N) with s the sample standard
  deviation of the per-problem values (the standard error lm-evaluation-harness reports), clipped
  to [0, 1]. With several samples per problem, s² is at least the mean over problems of each
  problem's own sampling variance (the delete-one jackknife of its estimate over its samples:
  s_i² / n_i for pass@1). s² estimates that variance plus the spread between problems, so the floor
  only matters where s² underestimates it: a single problem, or problems that happen to share one
  value (50 problems each solved by 1 of 2 samples has s = 0, yet its samples are coin flips).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

Z95 = 1.959963984540054


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of the chance that at least one of ``k`` samples drawn without
    replacement from ``n`` (``c`` correct) is correct."""
    if not 0 <= c <= n or k < 1 or k > n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def wilson_interval(successes: int, total: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion."""
    if total <= 0:
        return (0.0, 0.0)
    p = successes / total
    denom = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denom
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denom
    # at 0 and at 1 the bound is exactly 0 and 1 (in floating point centre - half leaves ~1e-17)
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == total else min(1.0, centre + half)
    return (low, high)


def mean_interval(values: Sequence[float], z: float = Z95, min_var: float = 0.0) -> tuple[float, float]:
    """mean ± z · s / sqrt(N), clipped to [0, 1], with s² the sample variance of ``values`` but at
    least ``min_var`` (one value has no sample variance: only ``min_var`` counts)."""
    n = len(values)
    if n == 0:
        return (0.0, 0.0)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    half = z * math.sqrt(max(var, min_var) / n)
    return (max(0.0, mean - half), min(1.0, mean + half))


def sampling_variance(scores: Sequence[float], k: int = 1) -> float:
    """The delete-one jackknife variance of one problem's pass@k estimate over its ``scores`` (pass@1:
    the mean score, whose jackknife variance is s² / n); 0 with too few samples (n - 1 < k)."""
    n = len(scores)
    if n - 1 < k:
        return 0.0
    if k == 1:
        mean = sum(scores) / n
        return sum((s - mean) ** 2 for s in scores) / ((n - 1) * n)
    # Leaving one sample out gives one of two estimates: without a correct one or without a wrong one.
    c = sum(is_correct(s) for s in scores)
    without_correct = pass_at_k(n - 1, c - 1, k) if c > 0 else 0.0
    without_wrong = pass_at_k(n - 1, c, k) if c < n else 0.0
    mean = (c * without_correct + (n - c) * without_wrong) / n
    return (n - 1) / n * (c * (without_correct - mean) ** 2 + (n - c) * (without_wrong - mean) ** 2)


@dataclass
class Metric:
    """A benchmark score: ``value`` in [0, 1] with its 95 % interval over ``problems`` problems."""

    name: str
    value: float
    ci_low: float
    ci_high: float
    problems: int
    samples: int

    def to_dict(self) -> dict:
        return asdict(self)


def interval(values: Sequence[float], sampling: Sequence[float] = ()) -> tuple[float, float]:
    """The 95 % interval of the mean of per-problem ``values``; ``sampling``: each problem's own
    sampling variance (:func:`sampling_variance`), whose mean bounds s² from below (see the module
    docstring)."""
    if all(v in (0.0, 1.0) for v in values):
        return wilson_interval(int(sum(values)), len(values))
    return mean_interval(values, min_var=sum(sampling) / len(values))


def is_correct(score: float) -> bool:
    """A sample counts as correct for pass@k when its score is 1 (partial credit is not a pass)."""
    return score >= 1.0 - 1e-9


def summarize(scores: Sequence[Sequence[float]], ks: Sequence[int] = (1,)) -> dict[str, Metric]:
    """``{"pass@1": Metric, "pass@k": Metric ...}`` of per-problem sample scores (``scores[i]`` are the
    samples of problem i). pass@1 is the mean score; pass@k (k > 1) uses the estimator above and is
    reported only when every problem has at least k samples."""
    rows = [list(s) for s in scores if len(s) > 0]
    if not rows:
        return {}
    out: dict[str, Metric] = {}
    total = sum(len(r) for r in rows)
    means = [sum(r) / len(r) for r in rows]
    low, high = interval(means, [sampling_variance(r) for r in rows])
    out["pass@1"] = Metric("pass@1", sum(means) / len(means), low, high, len(rows), total)
    n_min = min(len(r) for r in rows)
    for k in ks:
        if k <= 1 or k > n_min:
            continue
        values = [pass_at_k(len(r), sum(is_correct(s) for s in r), k) for r in rows]
        low, high = interval(values, [sampling_variance(r, k) for r in rows])
        out[f"pass@{k}"] = Metric(f"pass@{k}", sum(values) / len(values), low, high, len(rows), total)
    return out


def default_ks(n: int) -> list[int]:
    """The k reported for n samples: 1, then the powers of two below n, then n (evalplus reports
    1, 10, 100 for its large n; powers of two suit the small n people run locally)."""
    ks = [1]
    k = 2
    while k < n:
        ks.append(k)
        k *= 2
    if n > 1:
        ks.append(n)
    return ks
