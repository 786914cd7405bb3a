"""The side of an episode that lives on a Ray actor (:mod:`dsv32.rl.agentic.fanout` runs them).

:class:`_EpisodeActor` is the actor: it runs a function per episode, and hosts environments whose
agent loop runs elsewhere; :class:`ActorEnvironment` is such an environment as the driver sees it,
every method forwarded, every reply awaited at most a timeout. An actor that died turns each call
into an :class:`ActorGone` (an :class:`~dsv32.envs.base.EnvError`: the environment's failure, which
an episode records as such). :func:`add_masks` gives an actor the task files the driver read, which
its sandboxes mask.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from dsv32.envs.base import TASK_FILES, EnvError, Environment, Task


class ActorGone(EnvError):
    """The Ray actor holding an episode (or its environment) died: the environment's failure."""


def add_masks(masks: Iterable[str]) -> None:
    """Add ``masks`` (task files another process read) to this process's
    :data:`~dsv32.envs.base.TASK_FILES`, which its sandboxes mask."""
    TASK_FILES.update(masks)


class _EpisodeActor:
    """One Ray actor: runs whatever function it is given (one episode at a time), and hosts the
    environments of episodes whose agent loop runs elsewhere (:class:`ActorEnvironment`)."""

    def __init__(self) -> None:
        self.envs: dict[str, Environment] = {}

    def ready(self) -> int:
        return os.getpid()

    def run(self, fn: Callable[[Any], Any], item: Any, masks: Sequence[str] = ()) -> Any:
        add_masks(masks)
        return fn(item)

    def open(self, key: str, make_env: Callable[[], Environment], masks: Sequence[str] = ()) -> str:
        add_masks(masks)
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
    awaited at most ``timeout`` seconds. ``masks``: the driver's task files, added on the actor
    before ``make_env()`` runs; ``on_death(actor)``: called when the actor turns out dead (its calls
    then raise :class:`ActorGone`, and closing it does nothing: the environment died with it)."""

    def __init__(
        self,
        ray,
        actor,
        make_env: Callable[[], Environment],
        timeout: float,
        masks: Sequence[str] = (),
        on_death: Callable[[Any], None] | None = None,
    ) -> None:
        self.ray, self.actor, self.timeout = ray, actor, timeout
        self.on_death = on_death
        self.key = uuid.uuid4().hex
        self.dead = self.closed = False
        self.name = self._wait(actor.open.remote(self.key, make_env, list(masks)), "open")

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
        except ray.exceptions.RayActorError as err:  # the actor died, or its node
            self.dead = True
            if self.on_death is not None:
                self.on_death(self.actor)
            raise ActorGone(f"the environment's {method} on a Ray actor failed: {_first_line(err)}") from None
        except ray.exceptions.RayError as err:
            raise EnvError(f"the environment's {method} on a Ray actor failed: {_first_line(err)}") from None

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
        if self.closed or self.dead:  # a dead actor's environments died with it
            return
        self.closed = True
        with contextlib.suppress(ActorGone):  # it died since the last call
            self._wait(self.actor.close.remote(self.key), "close")


class _GoneEnvironment(Environment):
    """Where an episode's environment could not be opened because its actors kept dying: every
    method raises the :class:`ActorGone` (recorded as the environment's failure)."""

    def __init__(self, error: ActorGone) -> None:
        self.error = error
        self.name = "gone"

    def _fail(self, *args: Any) -> Any:
        raise ActorGone(str(self.error))

    reset = tools = call = reward = reference = _fail

    def close(self) -> None:
        pass


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
