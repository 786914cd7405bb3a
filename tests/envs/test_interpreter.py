"""The code interpreter: the sandboxed kernel (outputs, errors, timeouts, deaths, confinement), the
math task generator, the verifier, and the golden check over every shipped task."""

import json
from pathlib import Path

import pytest

from dsv32.envs.base import EnvError, Episode, Task, get_env, replay, resolve_tasks
from dsv32.envs.interpreter import InterpreterEnv, SandboxedKernel, generate
from dsv32.envs.interpreter.tasks import TASK_SETS
from dsv32.envs.interpreter.verify import last_boxed, math_equal


@pytest.fixture(scope="module")
def kernel():
    with SandboxedKernel(memory_mb=1024) as k:
        yield k


def test_cell_output_value_and_state(kernel):
    r = kernel.execute("x = 6\nprint('hello')\nx * 7")
    assert r.status == "ok" and r.text == "hello\n42"
    assert kernel.execute("x + 1").text == "7"  # variables persist between cells
    assert kernel.execute("y = 1").text == "[no output]"


def test_error_is_short_and_plain(kernel):
    r = kernel.execute("def f(n):\n    return 1 / n\nf(0)")
    assert r.status == "error" and r.text.endswith("ZeroDivisionError: division by zero")
    assert "----> 2     return 1 / n" in r.text and "\x1b[" not in r.text


def test_timeout_interrupts_and_keeps_the_kernel(kernel):
    kernel.execute("kept = 'still here'")
    r = kernel.execute("import time\nwhile True:\n    time.sleep(0.05)", timeout_s=1)
    assert r.status == "timeout" and "interrupted" in r.text
    assert kernel.execute("kept").text == "'still here'" and kernel.restarts == 0


def test_a_dead_kernel_is_restarted_with_a_note(kernel):
    kernel.execute("lost = 1")
    r = kernel.execute("import os\nos._exit(3)")
    assert r.status == "died" and "restarted" in r.text and kernel.alive()
    assert "NameError" in kernel.execute("lost").text
    assert kernel.execute("1 + 1").text == "2"


def test_long_output_is_cut(kernel):
    r = kernel.execute("print('a' * 50000 + 'END')", max_chars=1000)
    assert len(r.text) < 1100 and "characters cut" in r.text and r.text.endswith("END")


def test_kernel_is_confined(kernel):
    r = kernel.execute("open('/etc/dsv32-evil', 'w')")
    assert "Read-only file system" in r.text or "Permission denied" in r.text
    r = kernel.execute("import socket\nsocket.create_connection(('127.0.0.1', 1), timeout=1)")
    assert r.status == "error" and "Error" in r.text
    assert kernel.execute("bytearray(3 * 1024**3)").text.endswith("MemoryError: ")
    assert kernel.execute("open('mine.txt', 'w').write('ok')").text == "2"  # its own dir is writable


def test_generator_is_deterministic_and_scaled():
    a, b = generate(12, seed=5), generate(12, seed=5)
    assert [t.to_dict() for t in a] == [t.to_dict() for t in b]
    assert {t.info["category"] for t in a} == {"multiplication", "modular", "combinatorics", "linear_system"}
    small, big = generate(1, seed=3, difficulty=1)[0], generate(1, seed=3, difficulty=5)[0]
    assert len(big.answer) > len(small.answer)  # more digits at a higher difficulty
    with pytest.raises(EnvError, match="difficulty"):
        generate(1, difficulty=9)
    with pytest.raises(EnvError, match="unknown math categories"):
        generate(1, categories=("poetry",))


def test_verifier():
    assert last_boxed(r"so \boxed{1} or rather \boxed{\frac{1}{2}}.") == r"\frac{1}{2}"
    assert last_boxed("no box") is None and last_boxed(r"\boxed{unclosed") is None
    assert math_equal("1,000", "1000") and math_equal(r"\frac{1}{2}", "0.5")
    assert not math_equal("1001", "1000")


@pytest.mark.parametrize("name", list(TASK_SETS))
def test_golden_every_shipped_solution_computes_its_answer(kernel, name):
    """Each task's reference code, run in the sandboxed kernel, prints exactly its answer; the boxed
    answer scores 1 and a wrong one 0 (the verifier needs no kernel)."""
    env = InterpreterEnv()
    for task in TASK_SETS[name]():
        out = kernel.execute(task.info["solution_code"], timeout_s=60)
        assert out.text.strip() == task.answer, task.id
        env.reset(task)
        final = env.reference(task)[-1]["content"]
        assert env.reward(Episode([], final)).value == 1.0, task.id
        assert env.reward(Episode([], f"\\boxed{{{int(task.answer) + 1}}}")).value == 0.0, task.id


def test_reference_episode_through_the_tools():
    env = get_env("code-interpreter").factory()
    tasks = resolve_tasks("code-interpreter", "smoke")
    try:
        for task in tasks[:2]:
            episode = replay(env, task, env.reference(task))
            assert episode.messages[-2]["role"] == "tool"
            assert episode.messages[-2]["content"].strip() == task.answer
            reward = env.reward(episode)
            assert reward.value == 1.0 and reward.components == {"boxed": 1.0, "correct": 1.0}
            assert env.state()["calls"][0]["status"] == "ok"
        assert env.reward(Episode([], "I think it is 12.")).reason.startswith("no \\boxed")
    finally:
        env.close()


def test_bad_calls_are_texts_and_bad_tasks_errors():
    env = InterpreterEnv()
    with pytest.raises(EnvError, match="reset"):
        env.call("python", {"code": "1"})
    with pytest.raises(EnvError, match="answer"):
        env.reset(Task("t", "what?"))
    env.reset(Task("t", "1+1?", "2"))
    assert env.call("bash", {}).startswith("error: unknown tool")
    assert env.call("python", {"source": "1"}).startswith("error:")
    assert env.kernel is None  # no kernel was started for bad calls
    assert json.dumps(env.tools())  # the schema is JSON


def test_any_jsonl_of_prompt_and_answer(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"id": "q1", "prompt": "What is 2/4?", "answer": "1/2"}) + "\n")
    (task,) = resolve_tasks("code-interpreter", str(path))
    env = InterpreterEnv()
    episode = replay(env, task, env.reference(task))
    assert env.reward(episode).value == 1.0
    assert env.reward(Episode([], r"\boxed{0.5}")).value == 1.0


def test_a_cell_cannot_read_the_task_answers(kernel):
    """The kernel imports nothing of this project and reads none of its task sets."""
    import dsv32.envs.swe

    shipped = str(Path(dsv32.envs.swe.__file__).with_name("tasks.jsonl"))
    r = kernel.execute("import dsv32.envs.swe")
    assert r.status == "error" and "ModuleNotFoundError" in r.text, r.text
    r = kernel.execute(f"open({shipped!r}).read()")
    assert r.status == "error" and "FileNotFoundError" in r.text, r.text
