"""The search environment: every shipped question's reference solution, played through the tools,
finds its evidence and scores 1; a wrong answer scores 0; the tools answer bad calls with an error text."""

import json

import pytest

from dsv32.envs import EnvError, Episode, Task, get_env, resolve_tasks
from dsv32.envs.search import SearchEnv, stdlib_tasks
from dsv32.envs.search.questions import KINDS


@pytest.fixture(scope="module")
def tasks():
    return stdlib_tasks()


@pytest.fixture(scope="module")
def env():
    return SearchEnv()


def play(env, task, messages):
    """Replay assistant messages through the env's tools; return the episode and the tool outputs."""
    convo = env.reset(task)
    outputs = []
    for msg in messages:
        convo.append(msg)
        for call in msg.get("tool_calls", []):
            out = env.call(call["function"]["name"], json.loads(call["function"]["arguments"]))
            outputs.append(out)
            convo.append({"role": "tool", "tool_call_id": call["id"], "content": out})
    return Episode(convo, messages[-1]["content"]), outputs


def test_shipped_set_is_registered_and_mixes_every_kind(tasks):
    assert get_env("search").factory is SearchEnv
    assert [t.id for t in resolve_tasks("search")] == [t.id for t in tasks]
    assert len(tasks) == 100 and len({t.id for t in tasks}) == 100
    assert {t.info["kind"] for t in tasks} == set(KINDS)
    assert all(len(t.info["reference"]) == (2 if t.info["kind"].startswith("hop") else 1) for t in tasks)


def test_every_reference_finds_its_evidence_and_scores_one(env, tasks):
    for task in tasks:
        episode, outputs = play(env, task, env.reference(task))
        steps = task.info["reference"]
        for step, found, opened in zip(steps, outputs[0::2], outputs[1::2]):
            assert f"id: {step['doc_id']} |" in found, (task.id, step)
            assert step["evidence"] in opened, (task.id, step)
        reward = env.reward(episode)
        assert reward.value == 1.0, (task.id, reward.reason)
        assert env.state()["opened"] == [s["doc_id"] for s in steps]


def test_wrong_or_missing_answers_score_zero(env, tasks):
    for task in tasks:
        env.reset(task)
        assert env.reward(Episode([], "Answer: 'certainly not this'")).value == 0.0
        assert env.reward(Episode([], None)).value == 0.0
        near = str(task.answer) + "1" if task.info["kind"] != "module" else str(task.answer) + ".sub"
        assert env.reward(Episode([], f"Answer: {near}")).value == 0.0, task.id


def test_answer_forms_a_model_would_write_are_accepted(env):
    task = Task("t", "What is the default?", "'strict'", "search")
    env.reset(task)
    for final in ["Answer: 'strict'", "Answer: strict", "It is \\boxed{strict}.", "answer: `'strict'`."]:
        assert env.reward(Episode([], final)).value == 1.0, final
    assert env.reward(Episode([], "Answer: Strict")).value == 0.0


def test_tools_return_errors_as_text(env, tasks):
    env.reset(tasks[0])
    assert env.call("search", {"query": ""}).startswith("error:")
    assert env.call("search", {"query": "json", "k": 0}).startswith("error:")
    assert env.call("open", {"doc_id": "no.such.doc"}).startswith("error:")
    assert env.call("open", {"doc_id": "json.dumps", "page": 99}).startswith("error:")
    assert env.call("browse", {}).startswith("error:")
    assert env.call("search", {"query": "zzzqqq"}).startswith("no results")
    assert env.state()["errors"] == 5


def test_arguments_that_are_not_an_object_are_an_error_text_and_bad_episodes_are_env_errors(env, tasks):
    env.reset(tasks[0])
    assert env.call("search", "abc") == "error: the arguments of search must be a JSON object, got str"
    assert env.call("open", [1]).startswith("error: the arguments of open must be a JSON object")
    row = {"id": tasks[0].id, "prompt": tasks[0].prompt, "answer": tasks[0].answer}
    assert env.reset(row) == env.reset(tasks[0])  # a JSONL row works as the task it describes
    for bad in ("x", None, Episode([], final=7)):
        with pytest.raises(EnvError, match="reward\\(\\) takes a trajectory"):
            env.reward(bad)
    with pytest.raises(EnvError, match="reset\\(\\) takes a Task"):
        env.reset(42)


def test_a_task_without_answer_is_refused(env):
    with pytest.raises(EnvError, match="no answer"):
        env.reset(Task("t", "q"))


def test_every_environment_takes_task_rows_and_refuses_what_is_not_a_trajectory():
    """The base class gives any subclass (a user's too) what the shipped environments have."""
    from dsv32.envs import Environment, Reward

    class Echo(Environment):
        def reset(self, task):
            self.task = task
            return [{"role": "user", "content": task.prompt}]

        def tools(self):
            return []

        def call(self, name, arguments):
            return "error: no tools"

        def reward(self, trajectory):
            return Reward(float(trajectory.final == self.task.answer))

        def reference(self, task):
            return [{"role": "assistant", "content": task.answer}]

    env = Echo()
    assert env.reset({"id": "e", "prompt": "say x", "answer": "x"}) == [{"role": "user", "content": "say x"}]
    assert isinstance(env.task, Task) and env.reward(Episode([], "x")).value == 1.0
    with pytest.raises(EnvError, match="reward\\(\\) takes a trajectory"):
        env.reward({"final": "x"})
    with pytest.raises(EnvError, match="missing"):
        env.reset({"prompt": "no id"})
    for bad in (
        {"id": None},
        {"id": True},
        {"id": ""},
        {"id": "e", "domain": None},
        {"id": "e", "domain": 3},
    ):
        with pytest.raises(EnvError, match=r"'(id|domain)' must"):  # never the text "None"
            env.reset({"prompt": "p", **bad})
    assert env.reset({"id": 7, "prompt": "p"}) and env.task.id == "7"
