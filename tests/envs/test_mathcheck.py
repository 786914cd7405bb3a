"""One reading and one comparison of math answers for the environments, RL and evaluation; a hostile
answer is judged not equal within its timeout in any thread and never stalls the process."""

import threading

import pytest

from dsv32.envs import mathcheck
from dsv32.envs.interpreter.verify import math_equal as interpreter_equal
from dsv32.envs.mathcheck import answers_equal, boxes, last_boxed
from dsv32.envs.search.answers import extract as search_extract
from dsv32.eval.answers import choice_letter
from dsv32.eval.answers import math_equal as eval_equal
from dsv32.rl.grpo.rewards import extract_boxed, math_reward

HOSTILE = "9^{9^{9^{9}}}"  # SymPy's integer power holds the interpreter lock for minutes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{ \\frac{1}{2} }.", "\\frac{1}{2}"),
        ("\\boxed{1} then \\fbox{2}", "2"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\boxed{1} ... \\boxed{\\frac{3}{4}", None),
        ("\\boxed{ \\fbox{2} and", "2"),
        ("\\boxed{6 \\boxed{5}}", "6 {5}"),  # a box in a closed box is part of its answer
        ("\\boxed{ \\boxed{\\fbox{5}} }", "5"),
        ("\\boxed{\\boxed{1} + \\boxed{2}} and so on", "{1} + {2}"),
        ("no box", None),
        (None, None),
    ],
)
def test_every_reader_takes_the_same_box(text, expected):
    assert last_boxed(text) == expected
    if text is not None:
        assert extract_boxed(text) == expected
        if expected is not None:
            assert search_extract(text) == expected


def test_the_comparisons_agree():
    for pred, gold, equal in [
        ("1,000", "1000", True),
        ("\\frac{1}{2}", "0.5", True),
        ("1001", "1000", False),
    ]:
        assert answers_equal(pred, gold) is equal
        assert interpreter_equal(pred, gold) is equal
        assert eval_equal(gold, pred) is equal
        assert math_reward(f"\\boxed{{{pred}}}", gold) == float(equal)
    assert eval_equal("A) foo", "A) foo")  # equal text needs no parse
    assert not eval_equal("1", None) and not eval_equal("1", "  ")
    assert choice_letter("\\boxed{C}", "ABCD") == "C"


def test_boxes_reads_each_brace_once():
    # A looping completion of unclosed boxes: reading every box from its own "{" to the end of the
    # text would take minutes here.
    text = "\\boxed{" * 100_000
    assert last_boxed(text) is None
    assert boxes(text + "}")[-1] == (len(text) - len("\\boxed{"), "")


@pytest.mark.parametrize("judge", [interpreter_equal, lambda p, g: eval_equal(g, p)], ids=["envs", "eval"])
def test_a_hostile_answer_in_a_worker_thread_is_bounded(judge):
    # Checked in this process, the answer holds the interpreter lock for minutes (the join below
    # would not even return); the worker subprocess is killed at the timeout instead.
    verdicts: list[bool] = []
    worker = threading.Thread(target=lambda: verdicts.append(judge(HOSTILE, "1")), daemon=True)
    worker.start()
    worker.join(timeout=120)
    assert not worker.is_alive() and verdicts == [False]


def test_many_threads_checking_at_once_share_a_bounded_pool():
    # A lockstep batch of episodes ends together: every episode's answer is checked at the same
    # moment. They queue for the pool's workers (a check's timeout counts from when a worker has it)
    # instead of each starting a worker and timing out on the CPU the others' SymPy imports take.
    pool = mathcheck._WorkerPool(size=2)
    started, original = [], mathcheck._Worker.__init__

    def counting_init(self):
        started.append(self)
        original(self)

    cases = [(f"{n}", f"{n}", True) for n in range(10)] + [(f"{n}", f"{n + 1}", False) for n in range(10)]
    verdicts: dict[int, bool] = {}
    mp = pytest.MonkeyPatch()
    mp.setattr(mathcheck._Worker, "__init__", counting_init)
    try:
        threads = [
            threading.Thread(target=lambda i=i, c=c: verdicts.__setitem__(i, pool.check(c[0], c[1], 5.0)))
            for i, c in enumerate(cases)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        mp.undo()
        pool.close()
    assert verdicts == {i: equal for i, (_, _, equal) in enumerate(cases)}
    assert 1 <= len(started) <= 2


@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        (r"\boxed{6 $5$}", "5", 0.0),  # the box's whole content, not its delimited part
        (r"\boxed{$7$ $6$ $5$}", "5", 0.0),
        (r"\boxed{\(1\) \(5\)}", "5", 0.0),
        (r"\boxed{\[1\] \[5\] \[9\]}", "5", 0.0),
        (r"\boxed{$5$}", "5", 1.0),
        (r"\boxed{6 \boxed{5}}", "5", 0.0),  # the outer box's whole content, not the inner box
        (r"\boxed{\boxed{5}}", "5", 1.0),
        (r"\boxed{\frac{1}{2}}", r"$\frac12$", 1.0),
    ],
)
def test_math_delimiters_inside_an_answer_do_not_pick_out_one_value(completion, gold, expected):
    assert math_reward(completion, gold) == expected
    assert answers_equal(last_boxed(completion), gold) is bool(expected)
