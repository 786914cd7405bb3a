"""Fanning out environment episodes: threads of this process (the default) or Ray actors.

Both runners have two methods that matter, ``map(fn, items) -> [fn(item) ...]`` in order, and
``environment(make_env)`` — an environment to run one episode in — and ``close()``. :class:`ThreadRunner` runs ``fn`` on a thread pool. :class:`RayRunner` starts
``[ray] actors`` episode actors, each reserving ``cpus_per_actor`` CPUs (fractions allowed), on a
local cluster (``address = "local"``, started here with ``num_cpus`` CPUs and shut down by
:meth:`RayRunner.close`) or an existing one (``"ray://host:port"``, or a session this process
already started, which it leaves running); ``fn`` and the items travel to the actors by
cloudpickle. Every wait is bounded: the actors' CPUs are reserved first as a placement group, and
one that cannot be placed within ``placement_timeout`` seconds is a :class:`RayPlacementError`
(the message says what was asked and what the cluster has); placed actors that do not start within
:data:`STARTUP_TIMEOUT` seconds are one too, and a result that does not come within
``episode_timeout`` seconds is a ``TimeoutError``.

:func:`run_env_episodes` is what runs on either: one agent episode (:func:`dsv32.agent.run_episode`)
in a fresh environment per task, the environment closed after it, so its tools run model-written
code through :mod:`dsv32.envs.sandbox` in whichever process (thread or actor) holds the episode.
Nothing below :mod:`dsv32.rl` knows which runner it is on.

``environment(make_env)`` is what agentic GRPO (:func:`dsv32.rl.agentic.episodes.run_episodes`) uses: the
agent loop and the batched model calls stay in the trainer, and on Ray the environment itself —
``make_env()``, its tools (model-written code, confined by :mod:`dsv32.envs.sandbox` inside the
actor) and its verifier — lives on one of the actors (:class:`ActorEnvironment`, episodes spread
round-robin; an actor serves its episodes' calls one at a time). Each forwarded call waits at most
``episode_timeout`` seconds (then an :class:`~dsv32.envs.base.EnvError`, which the episode records
as the environment's failure). On threads it is ``make_env()`` itself.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsv32.envs.base import EnvError, Environment, Task
from dsv32.errors import DSV32Error
from dsv32.rl.grpo.config import RayConfig, RLConfigError

STARTUP_TIMEOUT = 120.0  # seconds placed actors may take to start their processes
RELEASE_S = 10.0  # seconds close() waits for the actors to release their files before killing them


class RayPlacementError(DSV32Error, RuntimeError):
    """Ray could not place (or start) the episode actors within the configured time."""


class ThreadRunner:
    """``map`` on ``workers`` threads of this process."""

    name = "threads"

    def __init__(self, workers: int = 4) -> None:
        self.workers = max(1, workers)

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        if not items:
            return []
        with ThreadPoolExecutor(min(self.workers, len(items))) as pool:
            return list(pool.map(fn, items))

    def environment(self, make_env: Callable[[], Environment]) -> Environment:
        return make_env()

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _EpisodeActor:
    """One Ray actor: runs whatever function it is given (one episode at a time), and hosts the
    environments of episodes whose agent loop runs elsewhere (:class:`ActorEnvironment`)."""

    def __init__(self) -> None:
        self.envs: dict[str, Environment] = {}

    def ready(self) -> int:
        return os.getpid()

    def run(self, fn: Callable[[Any], Any], item: Any) -> Any:
        return fn(item)

    def open(self, key: str, make_env: Callable[[], Environment]) -> str:
        env = self.envs[key] = make_env()
        return env.name

    def call(self, key: str, method: str, args: tuple) -> Any:
        return getattr(self.envs[key], method)(*args)

    def close(self, key: str) -> None:
        env = self.envs.pop(key, None)
        if env is not None:
            env.close()

    def release(self) -> None:
        """Before the actor is killed (its exit handlers never run): close the environments it
        still hosts and remove the files its sandboxes kept."""
        from dsv32.envs import sandbox

        for key in list(self.envs):  # one failing to close does not keep the others' files
            with contextlib.suppress(Exception):
                self.close(key)
        sandbox.release()


class ActorEnvironment(Environment):
    """An environment that lives on a Ray actor: every method is forwarded to it, each reply
    awaited at most ``timeout`` seconds."""

    def __init__(self, ray, actor, make_env: Callable[[], Environment], timeout: float) -> None:
        self.ray, self.actor, self.timeout = ray, actor, timeout
        self.key = uuid.uuid4().hex
        self.name = self._wait(actor.open.remote(self.key, make_env), "open")
        self.closed = False

    def _wait(self, ref, method: str) -> Any:
        ray = self.ray
        try:
            return ray.get(ref, timeout=self.timeout)
        except ray.exceptions.GetTimeoutError:
            ray.cancel(ref, force=False)
            raise EnvError(
                f"the environment's {method} on a Ray actor did not answer within {self.timeout:g} s "
                "([ray] episode_timeout)"
            ) from None
        except ray.exceptions.RayTaskError as err:  # the environment itself raised: its own error
            raise err.as_instanceof_cause() from None
        except ray.exceptions.RayError as err:  # the actor died, or its node
            raise EnvError(f"the environment's {method} on a Ray actor failed: {err}") from None

    def _call(self, method: str, *args: Any) -> Any:
        return self._wait(self.actor.call.remote(self.key, method, args), method)

    def reset(self, task: Task) -> list[dict]:
        return self._call("reset", task)

    def tools(self) -> list[dict]:
        return self._call("tools")

    def call(self, name: str, arguments: dict) -> str:
        return self._call("call", name, arguments)

    def call_bound_s(self, name: str) -> float | None:
        return self._call("call_bound_s", name)

    def reward(self, trajectory):
        return self._call("reward", trajectory)

    def reference(self, task: Task) -> list[dict]:
        return self._call("reference", task)

    def state(self) -> dict:
        return self._call("state")

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._wait(self.actor.close.remote(self.key), "close")


def _import_ray():
    try:
        import ray
    except ImportError:
        raise RLConfigError(
            "[ray] address is set but Ray is not installed: pip install 'dsv32[ray]' (or leave address "
            "empty to run episodes in threads)"
        ) from None
    return ray


class RayRunner:
    """``map`` on Ray actors as ``cfg`` (:class:`~dsv32.rl.grpo.config.RayConfig`) says."""

    name = "ray"

    def __init__(self, cfg: RayConfig, episode_timeout: float = 900.0) -> None:
        if not cfg.address:
            raise RLConfigError("[ray] address is empty: episodes run in threads (ThreadRunner)")
        ray = self.ray = _import_ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.cfg, self.episode_timeout = cfg, episode_timeout
        self.owns, self.actors, self.group = False, [], None
        if not ray.is_initialized():
            local = cfg.address == "local"
            ray.init(
                address=None if local else cfg.address,
                num_cpus=(cfg.num_cpus or None) if local else None,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
            self.owns = True
        # The CPUs are reserved first (a placement group: bookkeeping only, no process starts), so a
        # request the cluster cannot hold fails within placement_timeout however slowly workers start.
        self.group = placement_group([{"CPU": cfg.cpus_per_actor}] * cfg.actors)
        done, _ = ray.wait([self.group.ready()], timeout=cfg.placement_timeout)
        if not done:
            cpus = ray.cluster_resources().get("CPU", 0)
            self.close()
            raise RayPlacementError(
                f"{cfg.actors} Ray episode actors ({cfg.cpus_per_actor:g} CPUs each) could not be placed "
                f"within {cfg.placement_timeout:g} s; the cluster has {cpus:g} CPUs in all ([ray] actors × "
                "cpus_per_actor must fit, beside other work on the cluster)"
            )
        actor = ray.remote(num_cpus=cfg.cpus_per_actor, max_restarts=0)(_EpisodeActor)
        self.actors = [
            actor.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.group, placement_group_bundle_index=i
                )
            ).remote()
            for i in range(cfg.actors)
        ]
        self.next_actor = itertools.cycle(self.actors)
        self.lock = threading.Lock()
        try:
            self.pids = ray.get([a.ready.remote() for a in self.actors], timeout=STARTUP_TIMEOUT)
        except ray.exceptions.GetTimeoutError:
            self.close()
            raise RayPlacementError(
                f"the Ray episode actors were placed but did not start within {STARTUP_TIMEOUT:g} s"
            ) from None

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        from ray.util import ActorPool

        pool = ActorPool(self.actors)
        for item in items:
            pool.submit(lambda actor, value: actor.run.remote(fn, value), item)
        out = []
        while pool.has_next():
            out.append(pool.get_next(timeout=self.episode_timeout))
        return out

    def environment(self, make_env: Callable[[], Environment]) -> Environment:
        """``make_env()`` built on the next actor (round-robin), reached through an
        :class:`ActorEnvironment`."""
        with self.lock:
            actor = next(self.next_actor)
        return ActorEnvironment(self.ray, actor, make_env, self.episode_timeout)

    def close(self) -> None:
        """Kill the actors and free their CPUs; shut the cluster down when this runner started it.
        Each actor first closes what it hosts and removes its sandboxes' files (waited on at most
        ``RELEASE_S`` seconds: an actor busy or gone is killed all the same)."""
        if self.actors:  # a busy, dead or unreachable actor: killed below regardless
            with contextlib.suppress(Exception):
                self.ray.get([a.release.remote() for a in self.actors], timeout=RELEASE_S)
        for a in self.actors:
            self.ray.kill(a, no_restart=True)
        self.actors = []
        if self.group is not None and self.ray.is_initialized():
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.group)
        self.group = None
        if self.owns and self.ray.is_initialized():
            self.ray.shutdown()
        self.owns = False

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def processes_below(root: int | None = None) -> set[int]:
    """Pids of every process below ``root`` (default: this process), read from ``/proc`` (Linux)."""
    parents = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parents[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, frontier = set(), {root or os.getpid()}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - out
        out |= frontier
    return out


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip()
    except OSError:
        return ""


def ray_processes() -> set[int]:
    """Ray's processes below this one (GCS, raylet, workers, actors) and everything they started."""
    ours = {p for p in processes_below() if "ray" in command_line(p)}
    return ours.union(*(processes_below(p) for p in ours))


def still_running(pids: set[int], wait: float = 10.0) -> dict[int, str]:
    """Those of ``pids`` still running (zombies excluded) after up to ``wait`` seconds: pid → command."""
    deadline = time.monotonic() + wait

    def alive() -> dict[int, str]:
        out = {}
        for pid in pids:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state != "Z":
                out[pid] = command_line(pid)[:200]
        return out

    while (left := alive()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def episode_runner(cfg: RayConfig, threads: int = 4) -> ThreadRunner | RayRunner:
    """Threads when ``[ray] address`` is empty (the default), else Ray actors."""
    return RayRunner(cfg, cfg.episode_timeout) if cfg.address else ThreadRunner(threads)


def reference_backend(env, task):
    """The environment's reference solution as the episode's backend (benchmarks, checks)."""
    from dsv32.agent import ScriptedBackend

    return ScriptedBackend(env.reference(task))


@dataclass(frozen=True)
class EnvEpisode:
    """One episode to run: environment ``env`` (a registry name), ``task``, the backend
    ``make_backend(env, task)`` gives it, and the agent's options."""

    env: str
    task: Any
    make_backend: Callable
    agent_options: dict


def _run_env_episode(job: EnvEpisode) -> dict[str, Any]:
    from dsv32.agent import run_episode
    from dsv32.envs import get_env

    env = get_env(job.env).factory()
    start = time.perf_counter()
    try:
        trajectory, reward = run_episode(job.make_backend(env, job.task), env, job.task, **job.agent_options)
    finally:
        env.close()
    return {
        "id": job.task.id,
        "reward": reward.value,
        "components": reward.components,
        "scored": reward.scored,
        "reason": reward.reason,
        "trajectory": trajectory,
        "seconds": time.perf_counter() - start,
        "pid": os.getpid(),
    }


def run_env_episodes(
    runner: ThreadRunner | RayRunner,
    env: str,
    tasks: Sequence[Any],
    make_backend: Callable,
    agent_options: dict | None = None,
) -> list[dict[str, Any]]:
    """One episode per task on ``runner``; per task (in order): ``id``, ``reward``, ``components``,
    ``scored``, ``reason``, ``trajectory``, ``seconds`` and the ``pid`` of the process that ran it."""
    options = {"max_steps": 40, **(agent_options or {})}
    return runner.map(_run_env_episode, [EnvEpisode(env, t, make_backend, options) for t in tasks])
