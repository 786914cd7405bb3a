"""pass@k difficulty filtering: the estimator against its definition, and a scripted policy with known
success counts per task run through the real search environment, concurrently and resumed."""

from __future__ import annotations

import json
import threading
from math import comb

import pytest

from dsv32.agent import Completion, Usage
from dsv32.envs.base import Task
from dsv32.envs.search import SearchEnv
from dsv32.synth.filter import FilterConfig, distribution, pass_at_k, report_markdown, score_task
from dsv32.synth.records import JobFailed, Pricing, SynthError
from dsv32.synth.runner import Store, run_jobs


@pytest.mark.parametrize(
    ("n", "c", "k"), [(10, 0, 1), (10, 3, 1), (10, 3, 5), (10, 6, 5), (100, 1, 100), (20, 2, 10), (7, 7, 3)]
)
def test_pass_at_k_is_the_unbiased_estimator(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12)


def test_pass_at_k_edges():
    assert pass_at_k(100, 0, 100) == 0.0 and pass_at_k(100, 1, 100) == 1.0
    assert pass_at_k(10, 4, 1) == pytest.approx(0.4)
    for bad in ((5, 6, 1), (5, 1, 6), (5, 1, 0)):
        with pytest.raises(SynthError):
            pass_at_k(*bad)
    with pytest.raises(SynthError, match="n >= k"):
        FilterConfig(k=8, n=4)
    with pytest.raises(SynthError, match="stop_early"):
        FilterConfig(k=2, stop_early=True, drop_solved=True)
    with pytest.raises(SynthError, match="k must be an integer"):
        FilterConfig(k=2.5)
    with pytest.raises(SynthError, match="max_steps must be >= 1"):
        FilterConfig(k=2, max_steps=0)


class KnownRatePolicy:
    """Answers task ``t`` correctly in its first ``solves[t]`` episodes, wrongly after; thread-safe."""

    def __init__(self, solves: dict[str, int], gold: dict[str, str]) -> None:
        self.solves, self.gold = solves, gold
        self.seen: dict[str, int] = {}
        self.lock = threading.Lock()

    def count_tokens(self, messages, tools, *, thinking=True) -> int:
        return 10 * len(messages)

    def complete(self, messages, tools, *, thinking=True, sampling=None, on_delta=None) -> Completion:
        prompt = messages[-1]["content"]
        task = next(t for t in self.gold if t in prompt)
        with self.lock:
            i = self.seen[task] = self.seen.get(task, 0) + 1
        text = self.gold[task] if i <= self.solves[task] else "'wrong'"
        return Completion({"role": "assistant", "content": f"Answer: {text}"}, Usage(100, 5), "stop")


@pytest.fixture
def setup(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "d", "title": "d", "text": "filler"}) + "\n")
    solves = {"never": 0, "once": 1, "half": 4, "always": 8}
    tasks = [Task(f"t-{name}", f"Question {name}?", f"'{name}'", "search") for name in solves]
    policy = KnownRatePolicy(solves, {name: f"'{name}'" for name in solves})
    return tasks, policy, lambda: SearchEnv(str(corpus)), tmp_path


def _run(setup, config, out, workers=2):
    tasks, policy, make_env, tmp = setup
    by_key = {t.id: t for t in tasks}
    store = Store(tmp / out, "filter", {"generators": {"policy": "known-rate"}}, artifacts="unused")

    def work(key, store):
        return score_task(policy, make_env, by_key[key], config, key)

    return run_jobs(list(by_key), work, store, workers=workers), store


def test_filter_keeps_the_tasks_the_policy_sometimes_solves(setup):
    summary, store = _run(setup, FilterConfig(k=4, n=8), "keep")
    stats = {r["stats"]["task"]: r["stats"] for r in store.results}
    for task, c in {"t-never": 0, "t-once": 1, "t-half": 4, "t-always": 8}.items():
        assert "broken" not in stats[task], stats[task]  # the environment failed: its reason
        assert stats[task]["c"] == c and stats[task]["n"] == 8
        assert stats[task]["pass@4"] == pytest.approx(1 - comb(8 - c, 4) / comb(8, 4))
    kept = [json.loads(line) for line in (store.out / "tasks.jsonl").read_text().splitlines()]
    assert sorted(t["id"] for t in kept) == ["t-always", "t-half", "t-once"]
    assert summary["dropped"] == {"pass@4 = 0 (never solved)": 1}
    assert summary["tokens"]["prompt_tokens"] == 4 * 8 * 100
    once = next(t for t in kept if t["id"] == "t-once")
    assert once["info"]["filter"] == {"n": 8, "c": 1, "pass@1": 0.125, "pass@4": 0.5}
    dist = distribution(store.results, 4)
    assert dist["never_solved"] == 1 and dist["always_solved"] == 1 and dist["kept"] == 3
    assert dist["pass@1_histogram"]["0.0-0.1"] == 1 and dist["pass@1_histogram"]["0.9-1.0"] == 1
    assert dist["mean_pass@1"] == pytest.approx((0 + 1 / 8 + 4 / 8 + 1) / 4, abs=1e-4)
    report = report_markdown(dist, 4, "test")
    assert "| 0.5-0.6 | 1 |" in report
    assert report.count("mean pass@1:") == 1 and report.count("mean pass@4:") == 1


def test_the_report_of_pass_at_1_names_each_mean_once(setup):
    _, store = _run(setup, FilterConfig(k=1, n=2), "k1")
    report = report_markdown(distribution(store.results, 1), 1, "test")
    assert report.count("mean pass@1") == 1, report


def test_drop_solved_and_stop_early(setup):
    _, store = _run(setup, FilterConfig(k=8, drop_solved=True), "solved")
    kept = [json.loads(line)["id"] for line in (store.out / "tasks.jsonl").read_text().splitlines()]
    assert sorted(kept) == ["t-half", "t-once"]
    tasks, policy, make_env, tmp = setup
    policy.seen.clear()
    _, store = _run(setup, FilterConfig(k=8, stop_early=True), "early")
    n = {r["stats"]["task"]: r["stats"]["n"] for r in store.results}
    assert n == {"t-never": 8, "t-once": 1, "t-half": 1, "t-always": 1}
    assert distribution(store.results, 8)["lower_bounds"] is True


def test_a_resumed_filter_run_scores_only_what_is_left(setup):
    tasks, policy, make_env, tmp = setup
    config = FilterConfig(k=2, n=2)
    _run((tasks[:2], policy, make_env, tmp), config, "resume")
    calls_before = sum(policy.seen.values())
    summary, store = _run(setup, config, "resume")
    assert sum(policy.seen.values()) - calls_before == 2 * 2  # only the two tasks not scored before
    assert summary["jobs"] == 4


class DownPolicy(KnownRatePolicy):
    """Its endpoint fails every call while ``down`` is set (after the client's retries)."""

    down = True

    def complete(self, messages, tools, *, thinking=True, sampling=None, on_delta=None) -> Completion:
        from dsv32.agent.errors import BackendError

        if self.down:
            raise BackendError("http://127.0.0.1:9/v1: Connection error. (after up to 5 retries)")
        return super().complete(messages, tools, thinking=thinking, sampling=sampling, on_delta=on_delta)


def test_an_endpoint_failure_is_an_error_retried_next_run_not_a_drop(setup):
    tasks, _, make_env, tmp = setup
    policy = DownPolicy({"once": 1}, {"once": "'once'"})
    task = next(t for t in tasks if t.id == "t-once")
    store = Store(tmp / "down", "filter", {}, artifacts=None)

    def work(key, store, retry_errors=True):
        return score_task(policy, make_env, task, FilterConfig(k=2), key, retry_errors=retry_errors)

    summary = run_jobs([task.id], work, store)
    (row,) = store.results
    assert (
        row["status"] == "error"
        and "sample 1 got no answer from the policy: http://127.0.0.1:9" in row["error"]
    )
    assert summary["jobs_with_errors"] == 1 and summary["dropped"] == {} and store.done() == set()
    assert distribution(store.results, 2)["tasks"] == 0 and not (store.out / "tasks.jsonl").exists()
    policy.down = False
    store.close()
    summary = run_jobs([task.id], work, Store(tmp / "down", "filter", {}, artifacts=None))
    assert summary["jobs_with_errors"] == 0 and summary["kept"] == 1
    # a local model's backend failure (its window is full) is the policy failing, the same every run
    policy.down = True
    result = work(task.id, None, retry_errors=False)
    assert result.dropped and result.stats["stop_reasons"] == {"error": 2}


class FailsAfter(KnownRatePolicy):
    """Answers its first ``ok`` calls, then its endpoint fails every call."""

    def __init__(self, ok: int, *args) -> None:
        super().__init__(*args)
        self.ok = ok

    def complete(self, messages, tools, *, thinking=True, sampling=None, on_delta=None) -> Completion:
        from dsv32.agent.errors import BackendError

        if self.ok == 0:
            raise BackendError("http://127.0.0.1:9/v1: Connection error. (after up to 5 retries)")
        self.ok -= 1
        return super().complete(messages, tools, thinking=thinking, sampling=sampling, on_delta=on_delta)


def test_the_tokens_of_a_failed_job_count_in_the_totals(setup):
    tasks, _, make_env, tmp = setup
    task = next(t for t in tasks if t.id == "t-once")
    price = Pricing(input=10_000.0, output=10_000.0)  # 100 + 5 tokens a call: 1.05 USD

    def run(policy):
        work = lambda key, store: score_task(policy, make_env, task, FilterConfig(k=2), key, price)  # noqa: E731
        with Store(tmp / "paid", "filter", {}, artifacts=None) as store:
            return run_jobs([task.id], work, store), store.results[-1]

    summary, row = run(FailsAfter(1, {"once": 1}, {"once": "'once'"}))  # sample 2 of 2 fails
    assert row["status"] == "error" and row["usage"]["roles"]["policy"]["calls"] == 1
    assert summary["tokens"]["prompt_tokens"] == 100 and summary["cost_usd"] == pytest.approx(1.05)
    summary, row = run(FailsAfter(2, {"once": 1}, {"once": "'once'"}))  # the retry: both samples
    assert row["status"] == "kept" and summary["jobs_with_errors"] == 0
    assert summary["tokens"]["calls"] == 3 and summary["cost_usd"] == pytest.approx(3.15)


class BrokenReward(SearchEnv):
    def reward(self, trajectory):
        raise KeyError("x")


def test_a_task_the_environment_cannot_score_is_dropped_as_broken_not_retried(setup):
    from dsv32.envs.general.env import GeneralToolEnv

    tasks, policy, make_env, tmp = setup
    task = next(t for t in tasks if t.id == "t-once")
    result = score_task(policy, lambda: BrokenReward(make_env().corpus), task, FilterConfig(k=4), "b")
    why = "the environment's reward raised KeyError: 'x' (the agent had stopped with 'answer')"
    assert result.items == [] and result.dropped == [
        {"reason": "broken task", "task": "t-once", "detail": why}
    ]
    assert result.stats == {"task": "t-once", "n": 1, "broken": why}  # no more samples spent on it
    missing = Task("t-missing", "Book a hotel.", None, "general", {"bundle": str(tmp / "no-bundle")})
    result = score_task(policy, GeneralToolEnv, missing, FilterConfig(k=2), "m")
    assert result.dropped[0]["detail"].startswith(
        "the environment's reset/tools raised EnvError: task bundle"
    )
    dist = distribution([{"status": "dropped", "kept": [], "stats": result.stats}], 2)
    assert dist["broken"] == 1 and dist["tasks"] == 0 and "broken tasks" in report_markdown(dist, 2, "t")
    # a backend that failed is retried even when the environment then failed too
    down = DownPolicy({"once": 1}, {"once": "'once'"})
    with pytest.raises(JobFailed, match=r"got no answer from the policy: http://127\.0\.0\.1:9/v1"):
        score_task(down, lambda: BrokenReward(make_env().corpus), task, FilterConfig(k=2), "d")
