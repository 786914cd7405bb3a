"""pass@k against brute force over every k-subset, the intervals, and summarize()."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from dsv32.eval.metrics import (
    default_ks,
    is_correct,
    mean_interval,
    pass_at_k,
    sampling_variance,
    summarize,
    wilson_interval,
)


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    """The share of k-subsets of n samples (c correct) holding at least one correct sample."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 11))
def test_pass_at_k_equals_brute_force(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_matches_the_binomial_formula_for_large_n():
    n, c, k = 200, 37, 10
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), rel=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_wilson_interval_is_inside_zero_one_and_not_degenerate():
    low, high = wilson_interval(10, 10)
    assert 0.69 < low < 0.73 and high == pytest.approx(1.0)
    low, high = wilson_interval(0, 10)
    assert low == pytest.approx(0.0, abs=1e-12) and 0.27 < high < 0.31
    low, high = wilson_interval(50, 100)
    assert low == pytest.approx(0.4038, abs=1e-3) and high == pytest.approx(0.5962, abs=1e-3)


def test_mean_interval_is_the_normal_interval_clipped():
    low, high = mean_interval([0.25, 0.75, 0.5, 0.5])
    s = math.sqrt(((0.25**2) * 2) / 3)
    assert low == pytest.approx(0.5 - 1.959963984540054 * s / 2)
    assert high == pytest.approx(0.5 + 1.959963984540054 * s / 2)
    assert mean_interval([1.0, 1.0]) == (1.0, 1.0)


def test_summarize_pass1_is_the_mean_over_samples_and_passk_uses_the_estimator():
    scores = [[1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]]
    out = summarize(scores, ks=[1, 2, 4])
    assert out["pass@1"].value == pytest.approx((0.25 + 1 + 0) / 3)
    assert out["pass@2"].value == pytest.approx((pass_at_k(4, 1, 2) + 1 + 0) / 3)
    assert out["pass@4"].value == pytest.approx(2 / 3)
    assert out["pass@1"].problems == 3 and out["pass@1"].samples == 12
    assert "pass@8" not in summarize(scores, ks=[8])


def test_summarize_binary_single_samples_use_wilson():
    out = summarize([[1.0]] * 9 + [[0.0]])
    assert (out["pass@1"].ci_low, out["pass@1"].ci_high) == pytest.approx(wilson_interval(9, 10))


def test_partial_credit_counts_in_pass1_but_not_as_a_pass():
    out = summarize([[0.5, 1.0]], ks=[2])
    assert out["pass@1"].value == pytest.approx(0.75)
    assert out["pass@2"].value == pytest.approx(1.0)
    assert summarize([[0.5, 0.5]], ks=[2])["pass@2"].value == 0.0


def test_default_ks():
    assert default_ks(1) == [1]
    assert default_ks(4) == [1, 2, 4]
    assert default_ks(10) == [1, 2, 4, 8, 10]


def test_all_or_nothing_problems_do_not_collapse_the_interval():
    out = summarize([[0.0] * 4] * 16, ks=[1, 4])
    assert out["pass@1"].ci_low == 0.0 and out["pass@1"].ci_high == pytest.approx(wilson_interval(0, 16)[1])
    assert out["pass@4"].ci_high > 0.15
    mixed = summarize([[1.0, 0.0], [1.0, 1.0]])
    assert (mixed["pass@1"].ci_low, mixed["pass@1"].ci_high) == pytest.approx(mean_interval([0.5, 1.0]))


@pytest.mark.parametrize("scores", [[1, 0, 1, 1, 0], [1, 1, 0, 0, 0, 0, 1, 0], [0.5, 1.0, 0.0, 0.25]])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_sampling_variance_is_the_delete_one_jackknife(scores, k):
    n = len(scores)

    def estimate(rest):
        return sum(rest) / len(rest) if k == 1 else pass_at_k(len(rest), sum(map(is_correct, rest)), k)

    leave_one_out = [estimate(scores[:j] + scores[j + 1 :]) for j in range(n)]
    mean = sum(leave_one_out) / n
    assert sampling_variance(scores, k) == pytest.approx(
        (n - 1) / n * sum((t - mean) ** 2 for t in leave_one_out)
    )
    assert sampling_variance(scores[:k], k) == 0.0  # n - 1 < k: no estimate to leave one out of


def test_problems_sharing_one_value_keep_the_width_of_their_samples():
    # 50 problems, each solved by 1 of 2 samples: s = 0 over problems, but every sample is a coin flip.
    out = summarize([[1.0, 0.0]] * 50, ks=[1, 2])
    half = 1.959963984540054 * math.sqrt(0.25 / 50)  # s_i^2 / n_i = (1/2) / 2 per problem
    assert (out["pass@1"].ci_low, out["pass@1"].ci_high) == pytest.approx((0.5 - half, 0.5 + half))
    assert (out["pass@2"].ci_low, out["pass@2"].ci_high) == pytest.approx(wilson_interval(50, 50))  # all 1
    one = summarize([[1.0, 0.0] * 4])["pass@1"]  # a single problem: its samples' own interval
    half = 1.959963984540054 * math.sqrt(2 / 7 / 8)  # s^2 = 8 * 0.25 / 7
    assert (one.ci_low, one.ci_high) == pytest.approx((0.5 - half, 0.5 + half))
    spread = [[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [1.0, 1.0]]  # s^2 over problems exceeds the floor
    means = [1.0, 0.0, 0.5, 1.0]
    assert summarize(spread)["pass@1"].ci_low == pytest.approx(mean_interval(means)[0])


def test_the_interval_covers_the_true_rate_with_few_samples_per_problem():
    rng = random.Random(0)
    covered = 0
    for _ in range(1000):  # 5 problems of true rate 1/2, 4 samples each
        m = summarize([[float(rng.random() < 0.5) for _ in range(4)] for _ in range(5)])["pass@1"]
        covered += m.ci_low <= 0.5 <= m.ci_high
    assert covered >= 940  # the normal interval over problems alone covers about 87 % here


def test_wilson_bounds_are_exact_at_none_and_all():
    from dsv32.eval.metrics import wilson_interval

    for total in (1, 3, 10, 164, 1000):
        assert wilson_interval(0, total)[0] == 0.0 and wilson_interval(total, total)[1] == 1.0
    assert summarize([[0.0]] * 10)["pass@1"].ci_low == 0.0
