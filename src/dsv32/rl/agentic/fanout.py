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

An actor that dies (killed, out of memory, its node lost) fails only the episodes it held: each is
recorded as the environment's failure (an :class:`ActorGone`, an ``EnvError``: not scored, no
reward, the step goes on), and the runner starts a new actor in its place for the episodes that
follow (:attr:`RayRunner.replaced` counts them). A dead actor's sandboxes leave their directories;
:meth:`RayRunner.close` waits for its actors' processes to end and sweeps what they left
(:func:`dsv32.envs.sandbox.sweep_leftovers`), so nothing stays behind.

The answer-file masks (:data:`dsv32.envs.base.TASK_FILES`, the task files this process read, which
every sandbox binds ``/dev/null`` over) live in each process; an actor never read the driver's task
files, so every call to an actor carries the driver's masks and the actor adds them before it runs
anything (:func:`add_masks`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from dsv32.envs.base import TASK_FILES, Environment
from dsv32.errors import DSV32Error
from dsv32.rl.agentic.actors import ActorEnvironment as ActorEnvironment
from dsv32.rl.agentic.actors import ActorGone as ActorGone
from dsv32.rl.agentic.actors import _EpisodeActor, _first_line, _GoneEnvironment
from dsv32.rl.agentic.actors import add_masks as add_masks
from dsv32.rl.agentic.processes import command_line as command_line
from dsv32.rl.agentic.processes import processes_below as processes_below
from dsv32.rl.agentic.processes import ray_processes as ray_processes
from dsv32.rl.agentic.processes import still_running as still_running
from dsv32.rl.grpo.config import RayConfig, RLConfigError

STARTUP_TIMEOUT = 120.0  # seconds placed actors may take to start their processes
RELEASE_S = 10.0  # seconds close() waits for the actors to release their files before killing them

log = logging.getLogger(__name__)


class RayPlacementError(DSV32Error, RuntimeError):
    """Ray could not place (or start) the episode actors within the configured time."""


class ThreadRunner:
    """``map`` on ``workers`` threads of this process."""

    name = "threads"

    def __init__(self, workers: int = 4) -> None:
        self.workers = max(1, workers)

    def map(
        self,
        fn: Callable[[Any], Any],
        items: Sequence[Any],
        on_failure: Callable[[Any, ActorGone], Any] | None = None,
    ) -> list[Any]:
        """``[fn(item) ...]`` in order (``on_failure`` is for :meth:`RayRunner.map`'s dead actors;
        a thread of this process has none)."""
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
    """``map`` on Ray actors as ``cfg`` (:class:`~dsv32.rl.grpo.config.RayConfig`) says. An actor that
    dies is replaced (``replaced`` counts them; ``pids`` holds the live actors' process ids)."""

    name = "ray"

    def __init__(self, cfg: RayConfig, episode_timeout: float = 900.0) -> None:
        if not cfg.address:
            raise RLConfigError("[ray] address is empty: episodes run in threads (ThreadRunner)")
        ray = self.ray = _import_ray()
        from ray.util.placement_group import placement_group

        self.cfg, self.episode_timeout = cfg, episode_timeout
        self.owns, self.actors, self.group = False, [], None
        self.pids: list[int | None] = []
        self.gone: set[int] = set()  # the processes of actors that died or were killed
        self.replaced = 0
        self.lock = threading.Lock()
        self._next = 0
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
        self.actors = [self._actor(i) for i in range(cfg.actors)]
        try:
            self.pids = ray.get([a.ready.remote() for a in self.actors], timeout=STARTUP_TIMEOUT)
        except ray.exceptions.GetTimeoutError:
            self.close()
            raise RayPlacementError(
                f"the Ray episode actors were placed but did not start within {STARTUP_TIMEOUT:g} s"
            ) from None

    def _actor(self, bundle: int):
        """A new episode actor on the CPUs of bundle ``bundle`` of the placement group."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        actor = self.ray.remote(num_cpus=self.cfg.cpus_per_actor, max_restarts=0)(_EpisodeActor)
        strategy = PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=bundle)
        return actor.options(scheduling_strategy=strategy).remote()

    def _replace(self, actor) -> None:
        """``actor`` died: kill what is left of it and start a new one on its CPUs (once, whichever
        caller saw the death first). A new one that does not start within :data:`STARTUP_TIMEOUT`
        leaves the slot empty: the other actors go on."""
        ray = self.ray
        with self.lock:
            slot = next((i for i, a in enumerate(self.actors) if a is actor), None)
            if slot is None:  # replaced already
                return
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
            dead = self.pids[slot]
            if dead is not None:
                self.gone.add(dead)
            new = self._actor(slot)
            try:
                pid = ray.get(new.ready.remote(), timeout=STARTUP_TIMEOUT)
            except ray.exceptions.RayError as err:
                with contextlib.suppress(Exception):
                    ray.kill(new, no_restart=True)
                self.actors[slot], self.pids[slot] = None, None
                log.error("a Ray episode actor died and its replacement did not start: %s", _first_line(err))
                return
            self.actors[slot], self.pids[slot] = new, pid
            self.replaced += 1
        log.warning("a Ray episode actor (pid %s) died; a new one (pid %s) takes its episodes", dead, pid)
        from dsv32.envs import sandbox

        sandbox.sweep_leftovers()  # what the dead actor's sandboxes left, where its process is gone

    def _live(self) -> list:
        live = [a for a in self.actors if a is not None]
        if not live:
            raise RayPlacementError("every Ray episode actor died and none could be started again")
        return live

    def map(
        self,
        fn: Callable[[Any], Any],
        items: Sequence[Any],
        on_failure: Callable[[Any, ActorGone], Any] | None = None,
    ) -> list[Any]:
        """``[fn(item) ...]`` in order, one item at a time per actor. An item whose actor dies is
        ``on_failure(item, error)`` (without it the :class:`ActorGone` is raised), and the actor is
        replaced for the items that follow; ``fn`` raising is raised here."""
        ray, masks = self.ray, sorted(TASK_FILES)
        results: list[Any] = [None] * len(items)
        pending = deque(enumerate(items))
        running: dict[Any, tuple[int, Any]] = {}  # result ref → (item index, actor)
        while pending or running:
            with self.lock:
                busy = [a for _, a in running.values()]
                idle = [a for a in self._live() if all(a is not b for b in busy)]
            for actor in idle[: len(pending)]:
                i, item = pending.popleft()
                running[actor.run.remote(fn, item, masks)] = (i, actor)
            done, _ = ray.wait(list(running), num_returns=1, timeout=self.episode_timeout)
            if not done:
                raise TimeoutError(
                    f"no episode finished within {self.episode_timeout:g} s ([ray] episode_timeout)"
                )
            i, actor = running.pop(done[0])
            try:
                results[i] = ray.get(done[0])
            except ray.exceptions.RayActorError as err:
                self._replace(actor)
                failure = ActorGone(f"the Ray actor running item {i} died: {_first_line(err)}")
                if on_failure is None:
                    raise failure from None
                results[i] = on_failure(items[i], failure)
        return results

    def environment(self, make_env: Callable[[], Environment]) -> Environment:
        """``make_env()`` built on the next actor (round-robin), reached through an
        :class:`ActorEnvironment`. An actor found dead here is replaced and the environment built on
        the new one; if that dies too, the episode gets an environment whose every call is the
        :class:`ActorGone` (the environment's failure, recorded as such)."""
        error = None
        for _ in range(2):
            with self.lock:
                live = self._live()
                actor = live[self._next % len(live)]
                self._next += 1
            try:
                return ActorEnvironment(
                    self.ray, actor, make_env, self.episode_timeout, sorted(TASK_FILES), self._replace
                )
            except ActorGone as err:
                error = err
        return _GoneEnvironment(error)

    def close(self) -> None:
        """Kill the actors and free their CPUs; shut the cluster down when this runner started it.
        Each actor first closes what it hosts and removes its sandboxes' files (waited on at most
        ``RELEASE_S`` seconds: an actor busy or gone is killed all the same); then, once the actors'
        processes on this machine have ended, what sandboxes of dead actors left is swept."""
        actors = [a for a in self.actors if a is not None]
        if actors:  # a busy, dead or unreachable actor: killed below regardless
            with contextlib.suppress(Exception):
                self.ray.get([a.release.remote() for a in actors], timeout=RELEASE_S)
        for a in actors:
            with contextlib.suppress(Exception):
                self.ray.kill(a, no_restart=True)
        ours = {p for p in [*self.pids, *self.gone] if p is not None and "ray" in command_line(p)}
        self.actors, self.pids = [], []
        if self.group is not None and self.ray.is_initialized():
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.group)
        self.group = None
        if self.owns and self.ray.is_initialized():
            self.ray.shutdown()
        self.owns = False
        if ours or self.gone:
            from dsv32.envs import sandbox

            still_running(ours, wait=RELEASE_S)  # an actor killed a moment ago may still be exiting
            sandbox.sweep_leftovers()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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


def _failed_env_episode(job: EnvEpisode, error: ActorGone) -> dict[str, Any]:
    """The record of an episode whose actor died: the environment's failure, not scored."""
    from dsv32.agent import Trajectory

    note = f"the environment's episode failed: {error}"
    trajectory = Trajectory(messages=[], stop_reason="error", error=note)
    return {
        "id": job.task.id,
        "reward": 0.0,
        "components": {},
        "scored": False,
        "reason": f"not scored: {note}",
        "trajectory": trajectory,
        "seconds": 0.0,
        "pid": None,
    }


def run_env_episodes(
    runner: ThreadRunner | RayRunner,
    env: str,
    tasks: Sequence[Any],
    make_backend: Callable,
    agent_options: dict | None = None,
) -> list[dict[str, Any]]:
    """One episode per task on ``runner``; per task (in order): ``id``, ``reward``, ``components``,
    ``scored``, ``reason``, ``trajectory``, ``seconds`` and the ``pid`` of the process that ran it.
    An episode whose Ray actor died is ``scored`` False with reward 0 and the reason (``pid`` None)."""
    options = {"max_steps": 40, **(agent_options or {})}
    jobs = [EnvEpisode(env, t, make_backend, options) for t in tasks]
    return runner.map(_run_env_episode, jobs, on_failure=_failed_env_episode)
