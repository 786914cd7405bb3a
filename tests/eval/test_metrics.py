"""pass@k against brute force over every k-subset, the intervals, and summarize()."""

from __future__ import annotations

import itertools
import math

import pytest

from dsv32.eval.metrics import default_ks, mean_interval, pass_at_k, summarize, wilson_interval


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
