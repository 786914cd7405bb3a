"""Episodes on Ray actors when an actor dies, and the answer-file masks on actors: an episode whose
actor is killed (SIGKILL from inside, ``ray.kill`` from the driver) is the environment's failure —
not scored, no reward, the step goes on — the actor is replaced for the episodes that follow, and
``close()`` leaves no process and no sandbox directory; the task files the driver read are masked
in the actors' sandboxes too."""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
from pathlib import Path

import pytest

from dsv32.agent import ScriptedBackend, run_episode
from dsv32.envs import resolve_tasks
from dsv32.envs.base import TASK_FILES, Environment, Reward, Task, load_tasks
from dsv32.rl.agentic.fanout import (
    ActorGone,
    RayRunner,
    ThreadRunner,
    ray_processes,
    run_env_episodes,
    still_running,
)
from dsv32.rl.grpo.config import RayConfig

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")]

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # what runs on the actors travels by value


@pytest.fixture(scope="module")
def runner():
    runner = RayRunner(
        RayConfig(address="local", num_cpus=2, actors=2, cpus_per_actor=0.5, episode_timeout=120)
    )
    yield runner
    runner.close()


def _python(code: str) -> dict:
    arguments = json.dumps({"code": code})
    call = {"id": "c0", "type": "function", "function": {"name": "python", "arguments": arguments}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def _die(messages, tools):
    os.kill(os.getpid(), signal.SIGKILL)  # the process holding the episode: the actor itself


def reference_or_die(env, task):
    """Task 1 runs a cell (its kernel's directories now exist), then kills its own actor mid-episode;
    the others: the reference solution (reward 1)."""
    if task.id.endswith("1"):
        return ScriptedBackend([_python("print(6 * 7)"), _die])
    return ScriptedBackend(env.reference(task))


def _sandbox_dirs(pids) -> list[str]:
    """The sandbox directories in the temp dir owned by ``pids``."""
    from dsv32.envs.sandbox.leftovers import owner

    return [p.name for p in Path(tempfile.gettempdir()).glob("dsv32-*") if (owner(p.name) or (0,))[0] in pids]


def test_an_episode_whose_actor_dies_is_not_scored_and_the_actor_is_replaced(runner):
    tasks = resolve_tasks("code-interpreter", "smoke")[:4]
    before = list(runner.pids)
    out = run_env_episodes(runner, "code-interpreter", tasks, reference_or_die)
    assert [r["id"] for r in out] == [t.id for t in tasks]
    died = out[1]
    assert died["scored"] is False and died["reward"] == 0.0 and died["pid"] is None
    assert "actor" in died["reason"] and "died" in died["reason"]
    assert died["trajectory"].stop_reason == "error"
    assert [r["reward"] for i, r in enumerate(out) if i != 1] == [1.0, 1.0, 1.0]
    assert all(r["scored"] for i, r in enumerate(out) if i != 1)
    assert runner.replaced == 1 and len(runner.gone) == 1 and len(set(runner.pids)) == 2
    (dead,) = runner.gone
    assert dead in before and dead not in runner.pids and still_running({dead}, wait=10) == {}
    assert _sandbox_dirs({dead}) == []  # swept once the actor was replaced
    # the episodes that follow run on both actors, the new one included
    again = run_env_episodes(runner, "code-interpreter", [tasks[0], tasks[2], tasks[3], tasks[0]],
                             lambda env, task: ScriptedBackend(env.reference(task)))  # fmt: skip
    assert [r["reward"] for r in again] == [1.0] * 4 and {r["pid"] for r in again} == set(runner.pids)


class Tool(Environment):
    """One tool, ``f``; the answer is right when it is ``5``."""

    name = "tool-test"

    def reset(self, task):
        return [{"role": "system", "content": "s"}, {"role": "user", "content": task.prompt}]

    def tools(self):
        return [{"type": "function", "function": {"name": "f", "description": "a tool", "parameters": {
            "type": "object", "properties": {}, "required": []}}}]  # fmt: skip

    def call(self, name, arguments):
        return f"pid {os.getpid()}"

    def reward(self, trajectory):
        return Reward(float((trajectory.final or "").strip() == "5"), {}, "")

    def reference(self, task):
        return []

    def state(self):
        return {"masks": sorted(TASK_FILES)}


SCRIPT = [
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c0", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
    {"role": "assistant", "content": "5"},
]  # fmt: skip


def _until_dead(actor, seconds: float = 30.0) -> None:
    """Wait until ``actor``'s calls fail (a direct call, not through the runner: nothing is replaced)."""
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            ray.get(actor.close.remote("no-such-environment"), timeout=5)
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.RayError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"the killed actor still answers after {seconds:g} s")


def test_an_environment_whose_actor_is_killed_mid_episode_is_the_environments_failure(runner):
    """What agentic GRPO does with each episode (``runner.environment``, then ``run_episode`` in
    ``with env``), the actor killed by ``ray.kill`` after the first tool call."""
    task = Task("k-0", "q", "5", "tool")
    replaced = runner.replaced

    def kill_then_answer(messages, tools):
        ray.kill(env.actor, no_restart=True)
        _until_dead(env.actor)  # ray.kill returns before the actor is gone
        return SCRIPT[1]

    env = runner.environment(Tool)
    with env:
        trajectory, reward = run_episode(ScriptedBackend([SCRIPT[0], kill_then_answer, SCRIPT[2]]), env, task)
    assert reward.scored is False and reward.value == 0.0 and "Ray actor" in reward.reason
    tool_results = [m["content"] for m in trajectory.messages if m["role"] == "tool"]
    assert tool_results[0].startswith("pid ") and len(tool_results) == 2
    assert runner.replaced == replaced + 1 and all(a is not env.actor for a in runner.actors)
    for _ in range(2):  # the episodes that follow: on live actors, scored
        with runner.environment(Tool) as fresh:
            _, reward = run_episode(ScriptedBackend(SCRIPT), fresh, task)
        assert reward.scored and reward.value == 1.0
    with pytest.raises(ActorGone):  # the dead environment: its calls are the environment's failure
        env.call("f", {})


def _read_in_sandbox(path: str) -> str:
    from dsv32.envs import sandbox

    code = f"print(repr(open({path!r}).read()))"
    done = sandbox.run(
        [sandbox.PYTHON, "-c", code], timeout_s=60, memory_mb=512, readable=[os.path.dirname(path)]
    )
    return done.stdout.strip() or done.stderr[-500:]


def test_the_task_files_the_driver_read_are_masked_in_the_actors_sandboxes(runner):
    folder = Path(tempfile.mkdtemp(prefix="dsv32-masks-"))  # readable by a sandbox's own user id
    os.chmod(folder, 0o755)
    try:
        path = folder / "tasks.jsonl"
        path.write_text(json.dumps({"id": "a", "prompt": "2 + 3?", "answer": "SECRET-ANSWER-5"}) + "\n")
        os.chmod(path, 0o644)
        load_tasks(path)  # the driver read it: masked in its sandboxes
        assert str(path.resolve()) in TASK_FILES
        assert ThreadRunner(1).map(_read_in_sandbox, [str(path)]) == ["''"]
        on_actors = runner.map(_read_in_sandbox, [str(path)] * 2)
        assert on_actors == ["''", "''"], on_actors  # the answers stay hidden on every actor
        with runner.environment(Tool) as env:  # an environment held by an actor: the same masks
            assert str(path.resolve()) in env.state()["masks"]
    finally:
        TASK_FILES.discard(str(path.resolve()))
        for f in folder.iterdir():
            f.unlink()
        folder.rmdir()


def _held_sandbox_dirs(_) -> list[str]:
    """A work dir and the ``/etc`` files' directory this actor keeps (as a sandbox in use does)."""
    from dsv32.envs import sandbox

    return [sandbox.owned_tempdir("sandbox"), os.path.dirname(sandbox._etc_files()["/etc/passwd"])]


def test_close_leaves_no_process_and_no_sandbox_directory(runner):
    started = ray_processes()
    pids = {p for p in [*runner.pids, *runner.gone] if p is not None}
    held = [d for dirs in runner.map(_held_sandbox_dirs, [0, 1]) for d in dirs]
    assert len(held) == 4 and all(os.path.isdir(d) for d in held)
    os.kill(runner.pids[0], signal.SIGKILL)  # dies holding its sandbox files, never told
    runner.close()
    assert not ray.is_initialized()
    assert still_running(started | pids) == {}
    assert [d for d in held if os.path.exists(d)] == [] and _sandbox_dirs(pids) == []
