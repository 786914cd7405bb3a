"""reasoning-gym: reference answers score 1 through the harness, wrong or missing answers 0."""

from __future__ import annotations

import pytest

from dsv32.eval.rgym import FAMILIES, ReasoningGym, boxed_answer


@pytest.fixture(scope="module")
def bench():
    return ReasoningGym(per_family=10)  # zebra puzzles take ~0.3 s each to generate; the slow test runs all


@pytest.fixture(scope="module")
def problems(bench):
    return bench.problems()


def _failures(bench, problems):
    return [
        (p.id, s.reason) for p in problems for s in [bench.score(p, bench.reference(p))] if s.value != 1.0
    ]


def test_every_reference_answer_scores_one(bench, problems):
    assert len(problems) == len(FAMILIES) * 10
    assert {p.subset for p in problems} == set(FAMILIES)
    assert _failures(bench, problems) == []


@pytest.mark.slow
def test_every_reference_answer_of_the_default_set_scores_one():
    bench = ReasoningGym()
    problems = bench.problems()
    assert len(problems) == len(FAMILIES) * 50
    assert _failures(bench, problems) == []


def test_problems_are_the_same_every_time(problems):
    again = ReasoningGym(per_family=10).problems(["gcd"])
    assert [p.messages for p in again] == [p.messages for p in problems if p.subset == "gcd"]
    assert "put your final answer within \\boxed{}" in again[0].messages[0]["content"]


def test_wrong_and_missing_answers_score_zero(bench, problems):
    for family in FAMILIES:
        p = next(q for q in problems if q.subset == family)
        assert bench.score(p, {"content": "The answer is \\boxed{definitely not it 12345}"}).value < 1.0
        unboxed = bench.score(p, {"content": f"no box: {p.data['entry']['answer']}"})
        assert unboxed.value == bench._dataset(family).score_answer(None, p.data["entry"]) < 1.0


def test_other_notations_count_only_in_the_lenient_secondary_metric(bench, problems):
    p = next(q for q in problems if q.subset == "fraction_simplification")
    entry = p.data["entry"]
    num, den = str(entry["answer"]).strip("$").split("/")
    doubled = f"{2 * int(num)}/{2 * int(den)}"  # equal, not simplified: what the task tests
    official = bench._dataset("fraction_simplification").score_answer(doubled, entry)
    score = bench.score(p, {"content": f"\\boxed{{{doubled}}}"})
    assert score.value == official < 1.0 and score.secondary == {"lenient": 1.0}
    k = next(q for q in problems if q.subset == "knights_knaves")
    texted = bench.score(k, {"content": f"\\boxed{{\\text{{{k.data['entry']['answer']}}}}}"})
    assert texted.value < 1.0 and texted.secondary == {"lenient": 1.0}
    right = bench.score(k, bench.reference(k))
    assert right.value == 1.0 and right.secondary == {"lenient": 1.0}


def test_unknown_family_is_a_typed_error(bench):
    from dsv32.eval.errors import EvalError

    with pytest.raises(EvalError, match="no task family"):
        bench.problems(["no_such_family"])


def test_boxed_answer():
    assert boxed_answer("so \\boxed{\\text{Alice}}") == "Alice"
    assert boxed_answer("x \\boxed{1} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert boxed_answer("none") is None


def test_results_name_the_lenient_reading_apart_from_the_headline(tmp_path):
    from dsv32.eval import RunSettings, run

    results = run(RunSettings("reasoning-gym", subset=["gcd"], limit=3), tmp_path / "r", progress=False)
    assert results["metrics"]["pass@1"]["value"] == 1.0
    assert results["secondary"]["lenient"]["pass@1"]["value"] == 1.0
    assert "lenient (secondary" in (tmp_path / "r" / "report.md").read_text()
