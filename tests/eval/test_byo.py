"""Bring-your-own files: AIME-style boxed answers, MMLU-Pro- and GPQA-shaped multiple choice,
SWE-bench-shaped instances, and the paper's numbers beside them."""

from __future__ import annotations

import json

import pytest

from dsv32.eval.byo import Boxed, MultipleChoice, SweBench
from dsv32.eval.errors import EvalError
from dsv32.eval.paper import PAPER, paper_number


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


AIME = [
    {"id": "a1", "problem": "Find 1/2 + 1/4.", "answer": "3/4"},
    {"problem": "Compute 2^10.", "answer": "1024"},
]
MMLU = [{"question_id": 7, "question": "2 + 2?", "options": ["3", "4", "5", "6"], "answer": "B", "category": "math"},
        {"question_id": 8, "question": "Capital of France?", "options": ["Rome", "Paris"], "answer_index": 1,
         "category": "geo"}]  # fmt: skip
GPQA = [{"Record ID": "g1", "Question": "Which is a noble gas?", "Correct Answer": "Neon",
         "Incorrect Answer 1": "Iron", "Incorrect Answer 2": "Oxygen", "Incorrect Answer 3": "Sodium",
         "Subdomain": "Chemistry"}]  # fmt: skip


def test_boxed_reference_and_equivalent_forms(tmp_path):
    bench = Boxed()
    problems = bench.problems(data=_write(tmp_path / "aime.jsonl", AIME))
    assert [p.id for p in problems] == ["a1", "2"]
    assert (
        "Please reason step by step, and put your final answer within \\boxed{}."
        in problems[0].messages[0]["content"]
    )
    assert all(bench.score(p, bench.reference(p)).value == 1.0 for p in problems)
    assert bench.score(problems[0], {"content": "so \\boxed{\\frac{3}{4}}"}).value == 1.0
    assert bench.score(problems[0], {"content": "\\boxed{0.75}"}).value == 1.0
    assert bench.score(problems[0], {"content": "\\boxed{4/5}"}).value == 0.0
    assert bench.score(problems[0], {"content": "3/4"}).value == 0.0


def test_mcq_in_both_shapes(tmp_path):
    bench = MultipleChoice()
    problems = bench.problems(data=_write(tmp_path / "mmlu.jsonl", MMLU))
    assert [p.data["answer"] for p in problems] == ["B", "B"]
    assert "A) 3\nB) 4\nC) 5\nD) 6" in problems[0].messages[0]["content"]
    assert [p.subset for p in problems] == ["math", "geo"]
    assert all(bench.score(p, bench.reference(p)).value == 1.0 for p in problems)
    assert bench.score(problems[0], {"content": "The answer is (C)."}).value == 0.0
    assert bench.score(problems[0], {"content": "Answer: B"}).value == 1.0
    assert bench.score(problems[0], {"content": "I don't know"}).reason.startswith("no option letter")
    gpqa = bench.problems(data=_write(tmp_path / "gpqa.jsonl", GPQA))
    [p] = gpqa
    letter = p.data["answer"]
    assert f"{letter}) Neon" in p.messages[0]["content"]
    assert (
        bench.problems(data=str(tmp_path / "gpqa.jsonl"))[0].messages == p.messages
    )  # same shuffle every run
    assert bench.score(p, bench.reference(p)).value == 1.0


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"question": "q", "options": ["a", "b"]}], "'answer' must be an option letter"),
        ([{"question": "q", "options": ["a"], "answer": "A"}], "at least two options"),
        ([{"question": "q", "options": ["a", "b"], "answer": "C"}], "points past the 2 options"),
        ([{"options": ["a", "b"], "answer": "A"}], "missing field 'question'"),
        ([{"id": 1, "question": "q", "options": ["a", "b"], "answer": "A"}] * 2, "duplicate id '1'"),
    ],
)
def test_bad_mcq_rows_name_the_line(tmp_path, rows, message):
    path = _write(tmp_path / "bad.jsonl", rows)
    with pytest.raises(EvalError, match=r"bad\.jsonl:\d") as info:
        MultipleChoice().problems(data=path)
    assert message in str(info.value)


def test_byo_needs_a_file():
    with pytest.raises(EvalError, match="--data"):
        Boxed().problems()


def test_swe_bench_rows_become_swe_tasks(tmp_path):
    row = {"instance_id": "pkg-1", "repo": "org/pkg", "problem_statement": "it breaks", "package": "x==1.0",
           "bug": [], "FAIL_TO_PASS": json.dumps(["tests/test_a.py::test_x"]), "PASS_TO_PASS": []}  # fmt: skip
    [p] = SweBench().problems(data=_write(tmp_path / "swe.jsonl", [row]))
    task = p.data["task"]
    assert task.id == "pkg-1" and task.prompt == "it breaks"
    assert task.info["FAIL_TO_PASS"] == ["tests/test_a.py::test_x"] and task.info["package"] == "x==1.0"
    bad = _write(tmp_path / "bad.jsonl", [{**row, "FAIL_TO_PASS": "not json"}])
    with pytest.raises(EvalError, match="FAIL_TO_PASS is a string but not a JSON list"):
        SweBench().problems(data=bad)


def test_paper_numbers_have_sources_and_fit_their_formats():
    assert paper_number("aime-2025", "byo-boxed", thinking=True)["value"] == 93.1
    assert paper_number("swe-verified", "byo-swe", thinking=False)["value"] == 72.1
    assert "Table 2" in paper_number("gpqa-diamond", "byo-mcq", thinking=True)["source"]
    for number in PAPER.values():
        assert number.source.startswith("Table") and 0 < number.value < 100
    with pytest.raises(EvalError, match="runs as byo-mcq"):
        paper_number("gpqa-diamond", "byo-boxed", thinking=True)
    with pytest.raises(EvalError, match="no benchmark 'aime-2099'"):
        paper_number("aime-2099", "byo-boxed", thinking=True)
