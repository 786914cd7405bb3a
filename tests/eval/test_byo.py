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
    assert problems[0].id == "a1" and problems[1].id.startswith("row-")
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
        ([{"question": "q", "options": ["a", "b"], "answer": "A"}] * 2, "the same row as line 1"),
        (
            [{"id": None, "question": "q", "options": ["a", "b"], "answer": "A"}],
            "field 'id' must be a non-empty",
        ),
        ([{"id": True, "question": "q", "options": ["a", "b"], "answer": "A"}], "got true (a boolean)"),
        (
            [{"question": "q", "options": ["x", "y", "z"], "answer": True}],
            "'answer' must be an option letter",
        ),
        ([{"question": "q", "options": ["x", "y"], "answer": 1.0}], "'answer' must be an option letter"),
        (
            [{"question": "q", "options": ["x", "y"], "answer_index": "1"}],
            "'answer_index' must be an integer",
        ),
        (
            [{"question": "q", "options": ["x", "y"], "answer": "B", "answer_index": 0}],
            "name different options",
        ),
        ([{"question": "q", "options": [None, {"a": 1}], "answer": "A"}], "option 0 (A) must be a non-empty"),
        ([{"question": "q", "options": ["x", " "], "answer": "A"}], "option 1 (B) must be a non-empty"),
        ([{"question": "q", "options": ["x", True], "answer": "A"}], "option 1 (B) must be"),
        (
            [{"question": ["q"], "options": ["x", "y"], "answer": "A"}],
            "field 'question' must be a non-empty string",
        ),
        (
            [{"question": "q", "options": ["x", "y"], "answer": "A", "category": 3}],
            "field 'category' must be",
        ),
        (
            [{"Question": "q", "Correct Answer": None, "Incorrect Answer 1": "y"}],
            "field 'Correct Answer' must",
        ),
        (
            [{"Question": "q", "Correct Answer": "x", "Incorrect Answer 1": ["y"]}],
            "field 'Incorrect Answer 1'",
        ),
        ([{"Question": "q", "Correct Answer": "x"}], "needs 'Incorrect Answer 1'"),
    ],
)
def test_bad_mcq_rows_name_the_line(tmp_path, rows, message):
    path = _write(tmp_path / "bad.jsonl", rows)
    with pytest.raises(EvalError, match=r"bad\.jsonl:\d") as info:
        MultipleChoice().problems(data=path)
    assert message in str(info.value)


def test_mcq_answer_and_answer_index_that_agree_and_numeric_options(tmp_path):
    rows = [{"question": "q", "options": [3, 4.5], "answer": "B", "answer_index": 1, "category": None}]
    [p] = MultipleChoice().problems(data=_write(tmp_path / "mmlu.jsonl", rows))
    assert p.data["answer"] == "B" and "A) 3\nB) 4.5" in p.messages[0]["content"] and p.subset == ""


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"id": "a", "problem": "1+1?", "answer": None}, "field 'answer' must be a non-empty string or a number, got null"),
        ({"id": "b", "problem": "2+2?", "answer": [4]}, "field 'answer' must be a non-empty string or a number, got a list"),
        ({"id": "c", "problem": "x", "answer": True}, "field 'answer' must be a non-empty string or a number, got true"),
        ({"id": "c", "problem": "x", "answer": " "}, "got an empty string"),
        ({"id": "c", "problem": "x", "Answer": {"v": 1}}, "field 'Answer' must be a non-empty string or a number, got an object"),
        ({"id": "c", "problem": "x", "answer": float("nan")}, "got the number nan"),
        ({"id": "c", "problem": ["x"], "answer": "1"}, "field 'problem' must be a non-empty string, got a list"),
        ({"id": "d", "question": None, "answer": "1"}, "field 'question' must be a non-empty string, got null"),
        ({"id": "d", "problem": "x", "answer": "1", "subset": ["s"]}, "field 'subset' must be a string"),
    ],
)  # fmt: skip
def test_boxed_fields_of_the_wrong_type_name_the_line(tmp_path, row, message):
    path = _write(tmp_path / "bad.jsonl", [{"problem": "fine", "answer": "1"}, row])
    with pytest.raises(EvalError, match=r"bad\.jsonl:2: ") as info:
        Boxed().problems(data=path)
    assert message in str(info.value)


def test_boxed_numeric_answers_are_read_as_written(tmp_path):
    rows = [{"id": 1, "problem": "1+1?", "answer": 2}, {"id": 2, "problem": "1/2?", "answer": 0.5}]
    bench = Boxed()
    problems = bench.problems(data=_write(tmp_path / "aime.jsonl", rows))
    assert [p.data["answer"] for p in problems] == ["2", "0.5"] and [p.id for p in problems] == ["1", "2"]
    assert all(bench.score(p, bench.reference(p)).value == 1.0 for p in problems)


def test_rows_without_ids_are_named_by_their_content(tmp_path):
    rows = [{"problem": "1+1?", "answer": "2"}, {"problem": "2+2?", "answer": "4"}]
    before = {
        p.messages[0]["content"]: p.id for p in Boxed().problems(data=_write(tmp_path / "a.jsonl", rows))
    }
    edited = [{"problem": "What is 10*10?", "answer": "100"}, *rows, {"problem": "2+2?", "answer": "5"}]
    after = Boxed().problems(data=_write(tmp_path / "a.jsonl", edited))
    assert {p.messages[0]["content"]: p.id for p in after[1:3]} == before  # moved lines keep their ids
    assert len({p.id for p in after}) == 4  # the new and the edited row are new problems
    # the id follows the content, not the key order or the line
    swapped = [{"answer": "4", "problem": "2+2?"}]
    assert Boxed().problems(data=_write(tmp_path / "b.jsonl", swapped))[0].id == after[2].id


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
    for field, value, message in [
        ("problem_statement", None, "field 'problem_statement' must be a non-empty string, got null"),
        ("repo", ["org/pkg"], "field 'repo' must be a string, got a list"),
        (
            "instance_id",
            {"i": 1},
            "field 'instance_id' must be a non-empty string or an integer, got an object",
        ),
    ]:
        bad = _write(tmp_path / "bad.jsonl", [{**row, field: value}])
        with pytest.raises(EvalError, match=r"bad\.jsonl:1: ") as info:
            SweBench().problems(data=bad)
        assert message in str(info.value)


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
