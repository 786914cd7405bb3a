"""HumanEval through the harness's executor: every canonical solution passes, broken ones fail, and
programs run in the sandbox, not in the test process."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from dsv32.eval.executor import run_program
from dsv32.eval.humaneval import HumanEval, extract_program


@pytest.fixture(scope="module")
def bench():
    return HumanEval()


@pytest.fixture(scope="module")
def problems(bench):
    return bench.problems()


def _score_all(bench, pairs):
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda pm: bench.score(*pm), pairs))


def test_every_canonical_solution_passes(bench, problems):
    assert len(problems) == 164
    scores = _score_all(bench, [(p, bench.reference(p)) for p in problems])
    failed = [(p.id, s.reason) for p, s in zip(problems, scores) if s.value != 1.0]
    assert failed == []


def test_broken_solutions_fail(bench, problems):
    picked = problems[::8]
    broken = [(p, {"content": f"```python\n{p.data['prompt']}    return None\n```"}) for p in picked]
    scores = _score_all(bench, broken)
    assert [p.id for p, s in zip(picked, scores) if s.value != 0.0] == []
    assert all(s.reason for s in scores)


def test_an_endless_loop_times_out(bench, problems):
    p = problems[0]
    body = "    while True:\n        pass\n"
    score = run_program(
        f"{p.data['prompt']}{body}\n{p.data['test']}\ncheck({p.data['entry_point']})\n", timeout_s=2
    )
    assert score.value == 0.0 and "timed out" in score.reason


def test_programs_cannot_touch_the_harness(tmp_path):
    target = tmp_path / "written-by-the-model"
    run_program(f"open({str(target)!r}, 'w').write('x')\n")
    assert not target.exists()


def test_extraction_reads_a_whole_function_or_a_body():
    prompt = 'def add(a, b):\n    """Add."""\n'
    whole = "Here:\n```python\ndef add(a, b):\n    return a + b\n```\nDone."
    assert extract_program(prompt, "add", whole).endswith("def add(a, b):\n    return a + b\n")
    body = "```python\n    return a + b\n```"
    assert extract_program(prompt, "add", body) == prompt + "    return a + b\n"
    bare = "    return a + b\n"
    assert extract_program(prompt, "add", bare) == prompt + bare
    two = "```python\nimport math\n```\n```python\ndef add(a, b):\n    return b + a\n```"
    assert "return b + a" in extract_program(prompt, "add", two)


def test_a_chat_reply_with_the_function_passes(bench, problems):
    p = next(q for q in problems if q.id == "HumanEval/0")
    reply = (
        "Sure! Here is the function:\n\n```python\nfrom typing import List\n\n\n"
        "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
        "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1 :])\n```\n"
    )
    assert bench.score(p, {"content": reply}).value == 1.0
