"""Environment episodes on Ray actors: the same rewards as on threads, the sandbox still confining
model-written code inside the actors, bounded placement, nothing left running after shutdown."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

import dsv32
from dsv32.agent import ScriptedBackend
from dsv32.envs import resolve_tasks
from dsv32.rl.config import RayConfig, RLConfigError, load_rl_config
from dsv32.rl.fanout import RayPlacementError, RayRunner, ThreadRunner, episode_runner, run_env_episodes

ray = pytest.importorskip("ray")

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


def _parents() -> dict[int, int]:
    parents = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parents[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return parents


def descendants(root: int | None = None) -> set[int]:
    """Pids of every process below ``root`` (default: this process)."""
    parents = _parents()
    out, frontier = set(), {root or os.getpid()}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - out
        out |= frontier
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def ray_processes() -> set[int]:
    """Ray's processes below this one (GCS, raylet, workers and actors) and everything they started."""
    ours = {p for p in descendants() if "ray" in _cmdline(p)}
    return ours.union(*(descendants(p) for p in ours))


def still_running(pids: set[int], wait: float = 10.0) -> dict[int, str]:
    """Those of ``pids`` still running (not zombies) after up to ``wait`` seconds: pid → command line."""
    deadline = time.monotonic() + wait

    def alive() -> dict[int, str]:
        out = {}
        for pid in pids:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z":
                out[pid] = _cmdline(pid)[:200]
        return out

    while (left := alive()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    if ray.is_initialized():
        ray.shutdown()


def _tasks():
    return resolve_tasks("code-interpreter", "smoke")[:4]


def test_ray_runs_env_episodes_with_the_rewards_of_the_thread_path(cluster):
    tasks = _tasks()
    threads = run_env_episodes(ThreadRunner(2), "code-interpreter", tasks, probe_or_reference)
    cfg = RayConfig(address="local", actors=2, cpus_per_actor=0.5)
    with RayRunner(cfg) as runner:
        assert not runner.owns  # the module's session: this runner leaves it running
        on_ray = run_env_episodes(runner, "code-interpreter", tasks, probe_or_reference)
        actor_pids = set(runner.pids)
    assert [r["reward"] for r in on_ray] == [r["reward"] for r in threads] == [1.0, 0.0, 1.0, 0.0]
    assert {r["pid"] for r in on_ray} <= actor_pids and os.getpid() not in actor_pids
    assert {r["pid"] for r in threads} == {os.getpid()}
    for run in (threads, on_ray):  # model-written code is confined inside the actors as in threads
        results = [m["content"] for r in run[1::2] for m in r["trajectory"].messages if m["role"] == "tool"]
        assert results and all("hidden" in c and "visible" not in c for c in results)


def test_an_unsatisfiable_placement_fails_fast(cluster):
    cfg = RayConfig(address="local", actors=2, cpus_per_actor=4, placement_timeout=2)
    with pytest.raises(
        RayPlacementError,
        match=r"2 Ray episode actors \(4 CPUs each\) could not be placed within 2 s.*2 CPUs",
    ):
        RayRunner(cfg)


def test_threads_stay_the_default_and_ray_settings_are_checked():
    cfg = load_rl_config(None, [])
    assert cfg.ray.address == "" and isinstance(episode_runner(cfg.ray), ThreadRunner)
    with pytest.raises(RLConfigError, match="ray://"):
        load_rl_config(None, ["ray.address=localhost:6379"])
    with pytest.raises(RLConfigError, match="cpus_per_actor"):
        load_rl_config(None, ["ray.cpus_per_actor=0"])


def test_shutdown_leaves_no_process_behind(cluster):
    with RayRunner(RayConfig(address="local", actors=2, cpus_per_actor=0.5)) as runner:
        run_env_episodes(runner, "code-interpreter", _tasks()[:2], probe_or_reference)
    started = ray_processes()
    assert len(started) >= 3  # at least the GCS, the raylet and a worker
    ray.shutdown()
    assert still_running(started) == {}


def test_a_runner_that_starts_its_cluster_shuts_it_down(cluster):
    with RayRunner(RayConfig(address="local", num_cpus=1, actors=1, cpus_per_actor=0.25)) as runner:
        assert runner.owns and ray.is_initialized()
        assert runner.map(abs, [-3, 4]) == [3, 4]
        started = ray_processes()
    assert not ray.is_initialized()
    assert started and still_running(started) == {}
