"""The shipped SWE tasks are valid: FAIL_TO_PASS tests fail on the snapshot and pass with the
reference patch, PASS_TO_PASS tests pass on both, so the reference scores 1 and the unfixed
repository 0 (a sample by default, every task in the slow run)."""

import json
import random

import pytest

from dsv32.envs import Episode, get_env, resolve_tasks
from dsv32.envs.swe import SweEnv, mined_tasks


def play(env, messages):
    for msg in messages:
        for call in msg.get("tool_calls", []):
            yield (
                call["function"]["name"],
                env.call(call["function"]["name"], json.loads(call["function"]["arguments"])),
            )


def check_task(env, task):
    """The validity and golden check of one task, with two suite runs."""
    env.reset(task)
    info = task.info
    unfixed = env.reward(Episode([], "done"))
    assert unfixed.value == 0.0, (task.id, unfixed.reason)
    assert unfixed.components["fail_to_pass"] == 0.0 and unfixed.components["pass_to_pass"] == 1.0, task.id
    outputs = dict(play(env, env.reference(task)))
    assert outputs["edit_file"].startswith("edited"), outputs
    assert outputs["run_tests"].startswith(f"{len(info['FAIL_TO_PASS'])} passed"), outputs["run_tests"]
    fixed = env.reward(Episode([], "done"))
    assert fixed.value == 1.0, (task.id, fixed.reason)
    env.close()


def sample():
    """One task per shipped package, chosen at random."""
    by_package = {}
    for task in mined_tasks():
        by_package.setdefault(task.info["package"], []).append(task)
    return [random.Random(0).choice(ts) for _, ts in sorted(by_package.items())]


def test_shipped_tasks_are_registered_and_well_formed():
    tasks = mined_tasks()
    assert get_env("swe").factory is SweEnv
    assert [t.id for t in resolve_tasks("swe")] == [t.id for t in tasks]
    assert len({t.info["package"] for t in tasks}) == 3
    for task in tasks:
        info = task.info
        assert 1 <= len(info["FAIL_TO_PASS"]) <= 20 and info["PASS_TO_PASS"]
        assert not set(info["FAIL_TO_PASS"]) & set(info["PASS_TO_PASS"])
        assert info["bug"][0]["new"] not in task.prompt


@pytest.mark.parametrize("task", sample(), ids=lambda t: t.id)
def test_a_sample_of_shipped_tasks_is_valid(task):
    check_task(SweEnv(), task)


@pytest.mark.slow
@pytest.mark.parametrize("task", mined_tasks(), ids=lambda t: t.id)
def test_every_shipped_task_is_valid(task):
    check_task(SweEnv(), task)
