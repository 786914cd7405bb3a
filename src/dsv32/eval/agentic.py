"""The ``dsv32.envs`` environments as benchmarks: ``agent-<env>`` for every registered environment.

Problems: the environment's held-out task set (the set named ``heldout`` where it ships one, else its
first set; ``--subset NAME`` picks another set, ``--data FILE.jsonl`` a task file). An episode is
:func:`dsv32.agent.run_episode` on a fresh environment (reset, the agent on the environment's tools
with the run's thinking mode, sampling, ``max_steps`` and context strategy, then the environment's
verifier); the sample records the reward, the model calls of every thread (steps), the tokens and the
context resets. The reference replays ``env.reference(task)`` through a ``ScriptedBackend`` on the
same path.
"""

from __future__ import annotations

from typing import Any

from dsv32.eval.errors import EvalError
from dsv32.eval.types import Benchmark, EpisodeResult, Problem, RunOptions, Score

HELDOUT = "heldout"
PREFIX = "agent-"


def env_names() -> list[str]:
    from dsv32.envs.base import registry

    return sorted(registry())


def task_problem(task: Any) -> Problem:
    """A ``dsv32.envs`` task as a problem (its prompt the user message)."""
    return Problem(task.id, [{"role": "user", "content": task.prompt}], [], task.domain, {"task": task})


class EnvBenchmark(Benchmark):
    """Episodes of ``problem.data["task"]`` in the ``env_name`` environment of :mod:`dsv32.envs`."""

    kind = "episode"
    env_name = ""

    def episode(self, problem: Problem, backend: Any, options: RunOptions) -> EpisodeResult:
        """One scored episode in a fresh environment."""
        from dsv32.agent import run_episode
        from dsv32.envs.base import get_env

        with get_env(self.env_name).factory() as env:
            trajectory, reward = run_episode(backend, env, problem.data["task"], **options.agent_options())
        reason = reward.reason or trajectory.stop_reason
        if trajectory.error:
            reason = f"{reason}; {trajectory.error}"
        return EpisodeResult(
            trajectory.messages,
            Score(float(reward.value), reason),
            trajectory.total_steps,
            trajectory.total_tokens,
            len(trajectory.context_events),
            trajectory.stop_reason,
            trajectory.final,
        )

    def reference_replies(self, problem: Problem) -> list[dict]:
        from dsv32.envs.base import get_env

        with get_env(self.env_name).factory() as env:
            return env.reference(problem.data["task"])


class Agentic(EnvBenchmark):
    reads_data = True  # a task JSONL instead of the environment's task set

    def __init__(self, env_name: str) -> None:
        super().__init__()
        from dsv32.envs.base import get_env

        spec = get_env(env_name)
        self.env_name = env_name
        self.name = PREFIX + env_name
        self.description = f"agentic: {spec.description}"
        self.sets = list(spec.task_sets)
        default = HELDOUT if HELDOUT in self.sets else (self.sets[0] if self.sets else None)
        self.default_set = default
        self.source = f"dsv32.envs task set {default!r}" if default else "a task JSONL given with --data"

    def subsets(self) -> list[str]:
        return self.sets

    def problems(self, subset: list[str] | None = None, data: str | None = None) -> list[Problem]:
        from dsv32.envs.base import load_tasks, resolve_tasks

        if data is not None:
            return [task_problem(t) for t in load_tasks(data)]
        if subset and len(subset) != 1:
            raise EvalError(f"{self.name}: --subset names one task set of {', '.join(self.sets)}")
        name = subset[0] if subset else self.default_set
        if name is None:
            raise EvalError(f"{self.name}: the environment ships no task set; pass --data TASKS.jsonl")
        if name not in self.sets:
            raise EvalError(f"{self.name} has no task set {name!r}; known: {', '.join(self.sets)}")
        return [task_problem(t) for t in resolve_tasks(self.env_name, name)]
