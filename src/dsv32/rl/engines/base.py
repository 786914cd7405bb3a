"""The interface every rollout engine implements, and the version bookkeeping around it.

A :class:`RolloutEngine` turns token-id prompts into sampled continuations with what GRPO needs per
generated token: the sampling log-prob (π_old of Eq. 9), the kept top-k/top-p set (Keep Sampling
Mask) and, for the native MoE model, the routed experts (Keep Routing) — the latter two only where
the engine can return them. It also reports the *weight version* it samples with: the trainer
stamps each :meth:`RolloutEngine.sync` with the number of GRPO steps behind the weights, and a sample
whose version lags the trainer's by more than ``max_off_policy_steps`` is refused
(:func:`check_staleness`).

What an engine can do is declared on it (:class:`RolloutEngine`), never guessed from its name or
its type: ``shares_weights`` says whether it samples with the trainer's own model object.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from dsv32.engine.prefix import PrefixCache
from dsv32.errors import DSV32Error

logger = logging.getLogger(__name__)


class EngineError(DSV32Error, RuntimeError):
    """A rollout engine could not sample, sync weights or report its version (the message says why)."""


class StaleSampleError(DSV32Error, RuntimeError):
    """A sample was drawn with weights older than the recipe allows (``max_off_policy_steps``)."""


@dataclass
class EngineOutput:
    """One batch of continuations, row ``i`` for prompt ``i``.

    - ``tokens[i]`` / ``logprobs[i]``: generated ids (the end token included) and their sampling
      log-probs (of the truncated, renormalized distribution that was sampled from);
    - ``kept[i]`` ``[len(tokens[i]), K_i]`` ``int32`` −1-padded kept sets, or ``kept`` None when the
      engine did not return them;
    - ``routing`` ``[num_moe_layers, B, P + N - 1, k]`` in the layout of
      :func:`dsv32.engine.generate` (prompts left-padded to P, N the longest continuation), or None;
    - ``weight_version``: the version of the weights that sampled (None: the engine did not say);
    - ``indexing`` ``[DSA layers, B, P + N - 1, index_topk]`` ``int32`` the indexer's selections as
      row positions (Keep Indexing, :mod:`dsv32.dsa.keep`), laid out like ``routing``, or None.
    """

    tokens: list[list[int]]
    logprobs: list[list[float]]
    kept: list[torch.Tensor] | None
    routing: torch.Tensor | None
    weight_version: int | None
    indexing: torch.Tensor | None = None


SEED_MOD = 2**63 - 1


def turn_seed(generator: torch.Generator | None, turn: int) -> int | None:
    """The seed of turn ``turn`` of a rollout seeded by ``generator``: its initial seed at turn 0, a
    function of that seed and the turn after (None: unseeded)."""
    if generator is None:
        return None
    return (generator.initial_seed() + 1_000_003 * turn) % SEED_MOD


def turn_generator(
    generator: torch.Generator | Sequence[torch.Generator] | None, turn: int
) -> torch.Generator | list[torch.Generator] | None:
    """The generator turn ``turn`` samples with: ``generator`` itself at turn 0, else a fresh one
    seeded :func:`turn_seed` (on ``generator``'s device). Every engine derives a turn's noise this
    way, so a remote engine, which sees only a seed per request, draws what the in-process engine
    draws at every turn of a multi-turn rollout, not only the first. A generator per row (rows that
    share one draw from it together) gives one per row, the rows that shared a generator sharing its
    turn's."""
    if generator is None or turn == 0:
        return generator
    if not isinstance(generator, torch.Generator):
        fresh: dict[int, torch.Generator] = {}
        for g in generator:
            if id(g) not in fresh:
                fresh[id(g)] = turn_generator(g, turn)
        return [fresh[id(g)] for g in generator]
    return torch.Generator(device=generator.device).manual_seed(turn_seed(generator, turn))


def split_calls(
    engine, rows: Sequence[int], generator: torch.Generator | Sequence[torch.Generator] | None
) -> list[tuple[list[int], Any]]:
    """The engine calls that sample ``rows`` of a batch, as ``(rows, generator)`` pairs.
    ``generator``: None or one for all rows (one call), or one per row, the rows that share a
    generator object being one group: the in-process engine samples every group in one call (a
    generator per row, :func:`dsv32.engine.generate`) — as does any engine that
    :attr:`~RolloutEngine.shares_weights`; another engine, which sees one seed per request, gets one
    call per group (rows in order, groups in order of their first row). Either way a group samples
    the same whatever else is in the batch."""
    rows = list(rows)
    if generator is None or isinstance(generator, torch.Generator):
        return [(rows, generator)]
    generator = list(generator)
    if engine.shares_weights:
        return [(rows, generator)]
    groups: dict[int, tuple[list[int], torch.Generator]] = {}
    for row, g in zip(rows, generator, strict=True):
        groups.setdefault(id(g), ([], g))[0].append(row)
    return list(groups.values())


def run_calls(calls: Sequence[tuple[list[int], Any]], call: Callable[[tuple[list[int], Any]], Any]) -> list:
    """``call(c)`` for each of ``calls`` (:func:`split_calls`), concurrently when there are several
    (an engine in another process serves them together); results in the order of ``calls``."""
    if len(calls) == 1:
        return [call(calls[0])]
    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(call, calls))


class RolloutEngine(Protocol):
    """What :func:`dsv32.rl.grpo.rollout.rollout` samples with (in-process or over HTTP). Every
    engine declares each attribute and takes each keyword below; constructing one sends nothing
    (:meth:`connect`, or the first call that needs the engine, reaches it)."""

    name: str
    """How logs and messages call the engine (``"in_process"``, ``"remote"``); nothing branches on it."""

    shares_weights: bool
    """Whether the engine samples in the trainer's process with the trainer's current weights (its own
    model object, or a copy in another dtype that every :meth:`sync` refreshes). Then: :meth:`sync`
    runs before every rollout batch (a copy is cast from the trainer's weights; else it only stamps the
    version), one call samples rows with a generator per
    row (:func:`split_calls`), a ``prefix`` cache may be passed to :meth:`generate`, and a sample is
    never stale (no staleness metrics)."""

    synced: int | None
    """The version this engine object last pushed with :meth:`sync` (None before its first): a run
    takes an engine's served version for its own only when it pushed it (:func:`prepare_engine`)."""

    retried: int
    """How many requests this engine sent again after a transient failure (``[engine] retries``),
    over its life; 0 for an engine in process. The trainer records each step's as ``engine_retries``."""

    def connect(self) -> None:
        """Reach the engine, once (later calls return at once); an :class:`EngineError` that says why
        when it cannot be reached. :meth:`generate` and :meth:`weight_version` connect first."""
        ...

    def generate(
        self,
        prompts: Sequence[list[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        top_k: int,
        eos: list[int],
        pad: int,
        generator: torch.Generator | Sequence[torch.Generator] | None,
        turn: int,
        return_kept: bool,
        return_routing: bool,
        prefix: PrefixCache | None = None,
        return_indexing: bool = False,
    ) -> EngineOutput:
        """Sample a continuation of every prompt. ``return_indexing``: also the indexer's selections
        (a model with DSA in sparse mode; callers pass it only when they want them). ``generator`` seeds the rollout and ``turn`` counts
        its calls: turn ``t`` samples with :func:`turn_generator` (an engine in another process
        receives its seed, :func:`turn_seed`). A generator per row (rows that share one draw from it
        together) only where :attr:`shares_weights`; elsewhere :func:`split_calls` makes one call
        per generator. ``prefix``: a :class:`~dsv32.engine.prefix.PrefixCache` the calls of one batch
        of episodes share, only where :attr:`shares_weights` (elsewhere an :class:`EngineError`)."""
        ...

    def sync(self, model: torch.nn.Module, version: int) -> float:
        """Make the engine sample with ``model``'s weights, as ``version``; returns the seconds spent."""
        ...

    def weight_version(self) -> int | None:
        """The version of the weights the engine serves now (None before any sync)."""
        ...

    def close(self) -> None: ...


def check_staleness(versions: Sequence[int | None], current: int, max_off_policy_steps: int) -> list[int]:
    """Each sample's staleness ``current - version``; a :class:`StaleSampleError` when one has no
    version, one comes from weights newer than ``current`` (a sync from another run), or one lags by
    more than ``max_off_policy_steps``."""
    staleness = []
    for i, v in enumerate(versions):
        if v is None:
            raise StaleSampleError(
                f"sample {i} carries no weight version: the engine did not report the weights it sampled "
                "with, so stale samples could not be told apart (sync the engine's weights first)"
            )
        lag = current - v
        if lag < 0:
            raise StaleSampleError(
                f"sample {i} was drawn with weight version {v}, newer than the trainer's {current}: the "
                "engine serves weights this run did not push"
            )
        if lag > max_off_policy_steps:
            raise StaleSampleError(
                f"sample {i} was drawn with weight version {v}, {lag} step(s) behind the trainer's "
                f"{current}; the recipe allows {max_off_policy_steps} ([engine] max_off_policy_steps)"
            )
        staleness.append(lag)
    return staleness


def prepare_engine(
    engine: RolloutEngine, model: torch.nn.Module, step: int, max_off_policy_steps: int
) -> float:
    """Before the rollouts of ``step`` (the trainer's weights are version ``step``): sync the engine
    unless the version it serves is one this engine object pushed and at most
    ``max_off_policy_steps`` behind (so a run never takes another run's weights for its own, even
    with the same version number; an engine that shares the trainer's model is always current).
    Returns the seconds the sync took (0 without one)."""
    if engine.shares_weights:
        return engine.sync(model, step)
    served = engine.weight_version()
    if served is None or served != engine.synced or served > step or step - served > max_off_policy_steps:
        return engine.sync(model, step)
    return 0.0


class WarnOnce:
    """Log a message the first time only (per key), e.g. an engine that returns no kept sets."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(self, key: str, message: str) -> None:
        if key not in self.seen:
            self.seen.add(key)
            logger.warning(message)
