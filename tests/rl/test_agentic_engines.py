"""Agentic GRPO through the rollout engines and Ray: multi-turn episodes sampled by ``dsv32 serve``
in another process equal the in-process ones at every turn, an agentic step with the remote engine
equals the in-process step, and with the environments on Ray actors the rewards are those of the
thread path, the actors are gone after the run."""

from __future__ import annotations

import copy
import functools
import os
import sys
from dataclasses import replace

import pytest
import torch

pytest.importorskip("transformers")

import helpers.agentic
from helpers.agentic import SAMPLING, SETTINGS, TASKS, EchoEnv, agentic_config
from helpers.remote import serve_subprocess
from helpers.tolerances import ON_POLICY

from dsv32.rl.agentic.episodes import run_episodes
from dsv32.rl.agentic.trainer import train_agentic
from dsv32.rl.engines import FileWeightSync, InProcessEngine, RemoteEngine
from dsv32.runlog import read_metrics

pytestmark = pytest.mark.usefixtures("one_thread")

NOISY = replace(SAMPLING, temperature=0.8)  # later turns' noise changes what is sampled


@pytest.fixture(scope="module")
def server(one_thread, tool_user_dir):
    """``dsv32 serve`` of the tool user's architecture and tokens (one torch thread, as here)."""
    with serve_subprocess(str(tool_user_dir)) as url:
        yield url


def _records(episodes):
    """Per episode, per model call: prompt, tokens, log-probs and the kept sets (without padding)."""
    return [
        [
            (r.prompt, r.tokens, r.logprobs, [[i for i in k if i >= 0] for k in r.kept.tolist()])
            for r in e.records
        ]
        for e in episodes
    ]


def _same_samples(a, b) -> None:
    """The same prompts, tokens and kept sets at every call; log-probs equal up to the rounding of
    batched matmuls (the in-process engine prefills later calls from each episode's kept prefix)."""
    assert [[(p, t, k) for p, t, _, k in e] for e in a] == [[(p, t, k) for p, t, _, k in e] for e in b]
    for ea, eb in zip(a, b, strict=True):
        for (_, _, la, _), (_, _, lb, _) in zip(ea, eb, strict=True):
            assert torch.allclose(torch.tensor(la), torch.tensor(lb), atol=1e-5)


def test_multi_turn_episodes_sampled_remotely_equal_the_in_process_ones_at_every_turn(
    tool_user, server, tmp_path
):
    engine = RemoteEngine(server, sync=FileWeightSync(tmp_path))
    engine.sync(tool_user.model, 3)
    jobs = [(EchoEnv, TASKS[i % 4], "echo") for i in range(4)]

    def episodes(e):
        g = torch.Generator().manual_seed(11)
        return run_episodes(tool_user, jobs, NOISY, SETTINGS, generator=g, engine=e)

    local, remote = episodes(InProcessEngine(tool_user.model)), episodes(engine)
    assert max(len(e.records) for e in local) >= 2  # multi-turn: a tool call, then the answer
    _same_samples(_records(local), _records(remote))  # every turn: the same tokens, log-probs, kept sets
    assert {r.weight_version for e in remote for r in e.records} == {3}
    assert [e.verifier for e in local] == [e.verifier for e in remote]


def test_episodes_on_a_generator_per_group_sample_alike_in_process_and_remotely(tool_user, server, tmp_path):
    """A generator per group (the G episodes of a task share one): the in-process engine samples all
    groups in one call, the remote engine gets one call per group; either way a group's episodes do
    not depend on the other groups of the batch."""
    engine = RemoteEngine(server, sync=FileWeightSync(tmp_path))
    engine.sync(tool_user.model, 3)
    jobs = [(EchoEnv, TASKS[i // 2], "echo") for i in range(6)]  # 3 tasks × 2 episodes

    def episodes(e, groups):
        gens = {k: torch.Generator().manual_seed(100 + k) for k in groups}
        mine = [i for i in range(6) if i // 2 in groups]
        return run_episodes(
            tool_user,
            [jobs[i] for i in mine],
            NOISY,
            SETTINGS,
            generator=[gens[i // 2] for i in mine],
            engine=e,
        )

    local, remote = episodes(InProcessEngine(tool_user.model), [0, 1, 2]), episodes(engine, [0, 1, 2])
    alone = episodes(InProcessEngine(tool_user.model), [1])
    assert max(len(e.records) for e in local) >= 2
    assert len({tuple(r.tokens) for e in local for r in e.records[:1]}) > 1  # groups draw differently
    for a, b in [*zip(local, remote), *zip(local[2:4], alone)]:
        assert len(a.records) == len(b.records) and a.verifier == b.verifier
        for x, y in zip(a.records, b.records):
            assert (x.prompt, x.tokens) == (y.prompt, y.tokens)
            # the same noise; the log-probs of another batch composition agree up to fp32 rounding
            assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < 1e-5


def _agentic_cfg(tmp_path, **over):
    return agentic_config(
        tmp_path,
        **{
            "grpo.steps": 2,
            "agentic.eval_tasks": 0,
            "grpo.lr": 1e-2,
            "sampling.temperature": 0.8,
            "agentic.length_shape": "linear",
            **over,
        },  # rewards differ within a group: the policy moves
    )


def _train(policy, cfg):
    result = train_agentic(cfg, policy=policy, progress=False, evaluate_before=False, evaluate_after=False)
    return read_metrics(result.out_dir / "metrics.jsonl"), policy.model.state_dict()


def _same_training(ref, got, ref_state, state):
    for a, b in zip(ref, got):
        assert a["rows"] == b["rows"] and a["reward_mean"] == b["reward_mean"]
        same = {
            k: v for k, v in a.items() if isinstance(v, float) and not k.endswith("_s") and k != "seconds"
        }
        assert {k: b[k] for k in same} == pytest.approx(same, abs=1e-5)
    # each group is sampled in a call of its own remotely, with the others in process: the same tokens,
    # log-probs equal up to fp32 rounding, which Adam turns into update differences of entries whose
    # gradient cancels to ~0; so each tensor's difference is measured by its norm, relative to its norm
    # (measured: ≤ 7.5e-5 after 2 steps at lr 1e-2)
    errors = {k: float((state[k] - ref_state[k]).norm() / ref_state[k].norm()) for k in ref_state}
    assert max(errors.values()) <= 2e-4, sorted(errors.items(), key=lambda kv: -kv[1])[:3]


def test_agentic_grpo_with_dsv32_serve_as_engine_equals_the_in_process_run(tool_user, server, tmp_path):
    start = copy.deepcopy(tool_user)
    ref, ref_state = _train(copy.deepcopy(start), _agentic_cfg(tmp_path / "local"))
    remote = {"engine.kind": "remote", "engine.url": server}
    got, state = _train(copy.deepcopy(start), _agentic_cfg(tmp_path / "remote", **remote))
    _same_training(ref, got, ref_state, state)
    assert [r["first_update_abs_log_ratio"] < ON_POLICY for r in got] == [True, True]  # on-policy after sync
    assert all(r["staleness_max"] == 0 and len(r["staleness"]) >= 4 for r in got)
    assert RemoteEngine(server).weight_version() == 1  # synced before each step
    moved = max(float((ref_state[k] - start.model.state_dict()[k]).abs().max()) for k in ref_state)
    assert moved > 1e-4  # the steps did update the policy


def test_agentic_grpo_logs_staleness_when_the_recipe_allows_it(tool_user, server, tmp_path):
    over = {"engine.kind": "remote", "engine.url": server, "engine.max_off_policy_steps": 1}
    over["engine.sync"] = "collective"  # weights over a gloo group with the server
    got, _ = _train(copy.deepcopy(tool_user), _agentic_cfg(tmp_path, **over))
    assert [set(r["staleness"]) for r in got] == [{0}, {1}]  # step 2 sampled with version 0
    assert RemoteEngine(server).weight_version() == 0


class PidEnv(EchoEnv):
    """EchoEnv that notes, in ``directory``, the process each of its episodes ran in."""

    def __init__(self, directory):
        self.directory = directory

    def reset(self, task):
        with open(os.path.join(self.directory, f"{os.getpid()}-{task.id}"), "w"):
            pass
        return super().reset(task)


@pytest.mark.ray
def test_environments_on_ray_actors_give_the_rewards_of_the_thread_path(tool_user, tmp_path):
    ray = pytest.importorskip("ray")
    from dsv32.rl.agentic.fanout import RayRunner, ray_processes, still_running
    from dsv32.rl.grpo.config import RayConfig

    for module in (sys.modules[__name__], helpers.agentic):
        ray.cloudpickle.register_pickle_by_value(module)
    (tmp_path / "threads").mkdir()
    (tmp_path / "ray").mkdir()

    def episodes(where, runner=None):
        jobs = [(functools.partial(PidEnv, str(tmp_path / where)), TASKS[i % 4], "echo") for i in range(4)]
        g = torch.Generator().manual_seed(5)
        return run_episodes(tool_user, jobs, SAMPLING, SETTINGS, generator=g, runner=runner)

    threads = episodes("threads")
    runner = RayRunner(RayConfig(address="local", num_cpus=2, actors=2, cpus_per_actor=0.5))
    try:
        started = ray_processes()
        on_ray = episodes("ray", runner)
        pids = {int(p.name.split("-")[0]) for p in (tmp_path / "ray").iterdir()}
        assert len(pids) == 2 and pids <= set(runner.pids)  # spread over both actors
    finally:
        runner.close()
    assert still_running(started) == {}
    assert {int(p.name.split("-")[0]) for p in (tmp_path / "threads").iterdir()} == {os.getpid()}
    assert [e.verifier for e in on_ray] == [e.verifier for e in threads]
    assert sum(e.verifier for e in threads) >= 1  # some episode solved the task
    assert _records(on_ray) == _records(threads)
    # the tool results came back from the actors
    tool = [m["content"] for e in on_ray for m in e.trajectory.messages if m["role"] == "tool"]
    assert tool and all(c.startswith("RESULT-t") for c in tool)


@pytest.mark.ray
def test_a_recipe_with_ray_runs_agentic_grpo_on_actors_and_shuts_them_down(tool_user, tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")
    from dsv32.rl.agentic.fanout import RayRunner, ray_processes

    hosted = []  # the episodes whose environment an actor held
    place = RayRunner.environment
    monkeypatch.setattr(
        RayRunner, "environment", lambda self, make: hosted.append(place(self, make)) or hosted[-1]
    )

    ray.cloudpickle.register_pickle_by_value(helpers.agentic)  # its environment travels by value
    start = copy.deepcopy(tool_user)
    ref, ref_state = _train(copy.deepcopy(start), _agentic_cfg(tmp_path / "threads", **{"grpo.steps": 1}))
    on_ray = {"grpo.steps": 1, "ray.address": "local", "ray.num_cpus": 2, "ray.actors": 2}
    got, state = _train(copy.deepcopy(start), _agentic_cfg(tmp_path / "ray", **on_ray))
    _same_training(ref, got, ref_state, state)
    assert len(hosted) >= 2 and len({env.actor for env in hosted}) == 2  # spread over both actors
    assert not ray.is_initialized() and not ray_processes()  # the run's cluster is gone
