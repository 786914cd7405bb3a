"""Reward hacks on the search environment: one constant reply to every question (the prior a policy
finds before it learns to search), and looking for the answer key through the ``search`` and
``open`` tools. No constant reply earns more than 5% of any question kind; the tools reach no task
file and nothing of this project; the reference still scores 1."""

from __future__ import annotations

import sys
from collections import defaultdict

import pytest

from dsv32.envs import Episode
from dsv32.envs.search import SearchEnv, generate, shared_index, stdlib_tasks
from dsv32.envs.search.questions import CONSTANT_SHARE

# replies a policy tries first, beside every answer the set itself uses
GUESSES = ["None", "True", "False", "0", "1", "-1", "2", "''", "[]", "()", "os", "0.0", "'utf-8'", "'strict'"]


@pytest.fixture(scope="module")
def env():
    return SearchEnv()


def best_constants(env: SearchEnv, tasks) -> dict[str, tuple[float, str]]:
    """Per question kind, the constant reply with the highest mean reward, played through the env."""
    by_kind = defaultdict(list)
    for task in tasks:
        by_kind[task.info["kind"]].append(task)
    best = {}
    for kind, group in by_kind.items():
        replies = {str(t.answer) for t in group} | set(GUESSES)
        scores = defaultdict(float)
        for task in group:
            env.reset(task)
            for reply in replies:
                scores[reply] += env.reward(Episode([], f"Answer: {reply}")).value / len(group)
        reply = max(sorted(scores), key=scores.__getitem__)
        best[kind] = (scores[reply], reply)
    return best


def test_no_constant_reply_pays_on_the_shipped_set(env):
    tasks = stdlib_tasks()
    best = best_constants(env, tasks)
    assert len(best) == 5 and all(score <= CONSTANT_SHARE for score, _ in best.values()), best
    paid = 0.0
    for task in tasks:
        env.reset(task)
        paid += env.reward(Episode([], "Answer: None")).value
    assert paid / len(tasks) <= CONSTANT_SHARE


@pytest.mark.slow
@pytest.mark.parametrize(("n", "seed"), [(250, 1), (500, 2)])
def test_no_constant_reply_pays_on_larger_generated_sets(env, n, seed):
    index = shared_index()
    best = best_constants(env, generate(index.docs, index, n, seed))
    assert all(score <= CONSTANT_SHARE for score, _ in best.values()), best


def test_the_tools_reach_no_answer_key(env):
    tasks = stdlib_tasks()
    task = tasks[3]
    env.reset(task)
    stdlib = set(sys.stdlib_module_names) | {"builtins"}
    for query in (
        task.id,
        task.info["key"],
        task.prompt,
        "dsv32 tasks jsonl answer",
        "GENERATOR_VERSION",
        "FAIL_TO_PASS",
    ):
        out = env.call("search", {"query": query, "k": 20})
        ids = [
            line.split("id: ", 1)[1].split(" |", 1)[0] for line in out.splitlines() if line.startswith("[")
        ]
        assert all(i.split(".")[0] in stdlib for i in ids), (query, ids)
        assert task.prompt not in out and task.id not in out, query
    for doc_id in (
        "tasks",
        "../tasks.jsonl",
        "/etc/passwd",
        "dsv32",
        "dsv32.envs.search",
        task.id,
        task.info["key"],
    ):
        assert env.call("open", {"doc_id": doc_id}).startswith("error: no document"), doc_id
    episode_final = env.reference(task)[-1]["content"]
    assert env.reward(Episode([], episode_final)).value == 1.0
