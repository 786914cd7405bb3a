"""Environment episodes on Ray actors: the same rewards as on threads, the sandbox still confining
model-written code inside the actors, bounded placement, nothing left running after shutdown."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import dsv32
from dsv32.agent import ScriptedBackend
from dsv32.envs import resolve_tasks
from dsv32.rl.agentic.fanout import (
    RayPlacementError,
    RayRunner,
    ThreadRunner,
    episode_runner,
    ray_processes,
    run_env_episodes,
    still_running,
)
from dsv32.rl.grpo.config import RayConfig, RLConfigError, load_rl_config

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.ray

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the backends below travel by value

SOURCE = str(Path(dsv32.__file__))  # the project's source: hidden from model-written code


def probe_or_reference(env, task):
    """Even tasks: the reference solution (reward 1). Odd ones: look for the project's source from
    inside the sandbox, then a wrong answer (reward 0)."""
    if int(task.id.rsplit("-", 1)[-1]) % 2 == 0:
        return ScriptedBackend(env.reference(task))
    code = f"import os; print('visible' if os.path.exists({SOURCE!r}) else 'hidden')"
    call = {
        "id": "c0",
        "type": "function",
        "function": {"name": "python", "arguments": json.dumps({"code": code})},
    }
    return ScriptedBackend(
        [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "assistant", "content": "\\boxed{0}"},
        ]
    )


@pytest.fixture(scope="module")
def runner():
    """One local cluster for the module, started (and, in the last test, shut down) by its runner."""
    runner = RayRunner(RayConfig(address="local", num_cpus=2, actors=2, cpus_per_actor=0.5))
    yield runner
    runner.close()


def _tasks():
    return resolve_tasks("code-interpreter", "smoke")[:2]


def test_ray_runs_env_episodes_with_the_rewards_of_the_thread_path(runner):
    assert runner.owns
    tasks = _tasks()
    threads = run_env_episodes(ThreadRunner(2), "code-interpreter", tasks, probe_or_reference)
    on_ray = run_env_episodes(runner, "code-interpreter", tasks, probe_or_reference)
    assert [r["reward"] for r in on_ray] == [r["reward"] for r in threads] == [1.0, 0.0]
    assert {r["pid"] for r in on_ray} <= set(runner.pids) and os.getpid() not in runner.pids
    assert {r["pid"] for r in threads} == {os.getpid()}
    for run in (threads, on_ray):  # model-written code is confined inside the actors as in threads
        results = [m["content"] for m in run[1]["trajectory"].messages if m["role"] == "tool"]
        assert results and all("hidden" in c and "visible" not in c for c in results)


def test_an_unsatisfiable_placement_fails_fast_and_leaves_the_cluster_up(runner):
    cfg = RayConfig(address="local", actors=2, cpus_per_actor=4, placement_timeout=2)
    with pytest.raises(
        RayPlacementError,
        match=r"2 Ray episode actors \(4 CPUs each\) could not be placed within 2 s.*2 CPUs",
    ):
        RayRunner(cfg)
    assert ray.is_initialized()  # the failed runner did not start the session: it leaves it alone
    assert runner.map(abs, [-3, 4]) == [3, 4]  # and the actors placed before still run


def test_threads_stay_the_default_and_ray_settings_are_checked():
    cfg = load_rl_config(None, [])
    assert cfg.ray.address == "" and isinstance(episode_runner(cfg.ray), ThreadRunner)
    with pytest.raises(RLConfigError, match="ray://"):
        load_rl_config(None, ["ray.address=localhost:6379"])
    with pytest.raises(RLConfigError, match="cpus_per_actor"):
        load_rl_config(None, ["ray.cpus_per_actor=0"])


class SlowEnv:
    """An environment whose tool takes longer than the caller waits."""

    name = "slow"

    def call(self, name, arguments):
        import time

        time.sleep(4)
        return "late"

    def close(self):
        pass


def test_an_environment_held_by_an_actor_runs_model_code_in_the_sandbox_there(runner):
    from dsv32.envs import get_env

    task = _tasks()[0]
    env = runner.environment(get_env("code-interpreter").factory)
    with env:
        assert env.name == "code-interpreter" and env.reset(task)[-1]["content"]
        local = get_env("code-interpreter").factory()
        assert env.call_bound_s("python") == local.call_bound_s("python")  # the actor's own bound
        code = f"import os; print(os.getpid(), 'visible' if os.path.exists({SOURCE!r}) else 'hidden')"
        out = env.call("python", {"code": code})
        assert "hidden" in out and "visible" not in out
        assert int(out.split()[0]) not in {os.getpid(), *runner.pids}  # a sandboxed process of the actor's


def test_a_call_to_an_actor_held_environment_waits_at_most_its_timeout(runner):
    import time

    from dsv32.envs import EnvError
    from dsv32.rl.agentic.fanout import ActorEnvironment

    env = ActorEnvironment(ray, runner.actors[1], SlowEnv, timeout=1)
    t = time.monotonic()
    with pytest.raises(EnvError, match=r"call on a Ray actor did not answer within 1 s"):
        env.call("f", {})
    assert time.monotonic() - t < 3


def _sandbox_files(_) -> tuple[int, str]:
    """This process's pid and the folder of its sandboxes' ``/etc`` files (made if not yet)."""
    from dsv32.envs import sandbox

    return os.getpid(), os.path.dirname(sandbox._etc_files()["/etc/passwd"])


def test_the_runner_that_started_the_cluster_shuts_it_down_leaving_no_process_behind(runner):
    started = ray_processes()
    assert len(started) >= 3  # at least the GCS, the raylet and the actors
    files = dict(runner.map(_sandbox_files, range(4)))
    assert len(files) == 2 and all(os.path.isdir(f) for f in files.values())
    runner.close()
    assert not ray.is_initialized()
    assert still_running(started) == {}
    assert [f for f in files.values() if os.path.exists(f)] == []  # killed actors leave no files
