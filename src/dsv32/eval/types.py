"""What every benchmark hands the runner: problems, scores, and (for agentic ones) episodes.

Two kinds of benchmark:

- **single-turn** (``kind = "single"``): a problem is OpenAI-style ``messages`` (and ``tools``); the
  model answers with one assistant message; :meth:`Benchmark.score` grades it;
  :meth:`Benchmark.reference` is the benchmark's own solution written as such a message.
- **episodic** (``kind = "episode"``): the model acts through ``dsv32.agent`` over several steps or
  turns; :meth:`Benchmark.episode` runs one with a backend and returns an :class:`EpisodeResult`;
  :meth:`Benchmark.reference_replies` are the assistant messages that play the solution, which a
  ``ScriptedBackend`` replays through the very same path.

``--backend reference`` answers with the reference solution through the same scorer, so it must
score 100 %: the harness's self-check.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Problem:
    """One problem: ``id`` (unique within the benchmark), ``messages`` (what the model is sent, for
    single-turn benchmarks the whole prompt), ``tools`` (OpenAI schemas), ``subset`` (a category or
    task family, for the per-subset table) and ``data`` (what the scorer needs)."""

    id: str
    messages: list[dict]
    tools: list[dict] = field(default_factory=list)
    subset: str = ""
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Score:
    """A graded sample: ``value`` in [0, 1] (the benchmark's own verdict, the headline), a short human
    ``reason``, and ``secondary``: other readings of the same answer by name (e.g. ``lenient``),
    reported beside the headline, never in its place."""

    value: float
    reason: str = ""
    secondary: dict[str, float] = field(default_factory=dict)


@dataclass
class EpisodeResult:
    """One agentic episode: the conversation, its score and what it spent."""

    messages: list[dict]
    score: Score
    steps: int = 0
    tokens: int = 0
    resets: int = 0
    stop_reason: str = ""
    final: str | None = None


@dataclass
class RunOptions:
    """What a benchmark's episodes need from the run settings; the fields are keywords of
    :class:`dsv32.agent.Agent` and :func:`dsv32.agent.run_episode` by the same names."""

    thinking: bool = True
    sampling: dict = field(default_factory=dict)
    context: str = "none"
    context_window: int | None = None
    max_steps: int = 50

    def agent_options(self) -> dict[str, Any]:
        """The fields as the agent's keywords (``sampling`` a copy)."""
        return asdict(self)


class Benchmark(ABC):
    """A benchmark: ``name``, ``description``, ``kind`` ("single" or "episode"), ``subsets`` it can
    be restricted to (``--subset``), ``needs_data`` (bring-your-own benchmarks read ``--data``),
    ``reads_data`` (``--data`` may replace its shipped problems) and ``source`` (where its data comes
    from, for ``dsv32 eval list`` and the report). A run refuses ``--subset`` or ``--data`` where
    they would be ignored."""

    name: str = ""
    description: str = ""
    kind: str = "single"
    source: str = ""
    needs_data: bool = False
    reads_data: bool = False
    #: what the mean score is called: "pass@1" (sampled programs, episodes) or "accuracy" (exact answers)
    metric: str = "pass@1"
    #: the installed packages its data and scorers come from (their versions go to results.json)
    packages: tuple[str, ...] = ()

    def __init__(self) -> None:
        #: ``{problem id: why}`` of the problems :meth:`problems` left out (recorded in results.json).
        self.excluded: dict[str, str] = {}

    def subsets(self) -> list[str]:
        return []

    def subset_summaries(self, subsets: dict[str, dict]) -> dict:
        """Fields for results.json that the benchmark forms from the metrics of every subset the run
        scored (``{subset: {"pass@1": ...}}``, a run of one subset included): BFCL's leaderboard
        groups; none for most benchmarks."""
        return {}

    @abstractmethod
    def problems(self, subset: list[str] | None = None, data: str | None = None) -> list[Problem]: ...

    # single-turn benchmarks
    def score(self, problem: Problem, message: dict) -> Score:
        raise NotImplementedError(f"{self.name} is not a single-turn benchmark")

    def reference(self, problem: Problem) -> dict:
        raise NotImplementedError(f"{self.name} is not a single-turn benchmark")

    # episodic benchmarks
    def episode(self, problem: Problem, backend: Any, options: RunOptions) -> EpisodeResult:
        raise NotImplementedError(f"{self.name} is not an episodic benchmark")

    def reference_replies(self, problem: Problem) -> list[dict]:
        raise NotImplementedError(f"{self.name} is not an episodic benchmark")

    def versions(self) -> dict[str, str]:
        """``{package: version}`` of :attr:`packages` (recorded in results.json)."""
        from importlib.metadata import version

        return {name: version(name) for name in self.packages}
