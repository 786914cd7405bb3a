"""Agentic GRPO rollouts: G multi-turn episodes per task through :mod:`dsv32.agent` in
:mod:`dsv32.envs` environments, turned into GRPO training rows.

An episode is a conversation: the environment's task, then model calls (think, call a tool, read its
result, ... answer) until the answer or ``max_steps``. Its reward is the environment's verifier plus
the length and language terms (§3):

    R = verifier + w_len · length_penalty(generated tokens, budget) + w_lang · language_consistency
        + w_fmt · format

where ``format`` is 1 when the episode's tool use is well formed (:func:`tool_calls_valid`: it
called a tool, every reply parsed as V3.2 and every call named a known tool with valid arguments),
else 0 — the verifier rewards the answer, not the markup.

Every model call is recorded with the prompt ids it saw (:mod:`dsv32.rl.agentic.batcher`). Rows:
consecutive calls whose prompt starts with the previous row's ids (the V3.2 encoding only appends
within a task: the reply, the tool results, ``<think>``) share one row — prompt, turn 1, tool
results, turn 2, ... — with ``action_mask`` 1 exactly on the sampled tokens, so tool results and
rendered context carry no loss and one training forward reproduces every turn's sampling context.
A call whose prompt does not extend the row (a context reset of §4.4, a reply re-tokenized
differently from how it was sampled) starts a new row; the context it re-renders is its prompt,
masked. Every row of an episode gets the episode's advantage ``A = R − mean(group)``; in the loss the
rows of an episode are one output o_i (the trainer passes the episode as the rows' sequence id, see
:func:`dsv32.rl.grpo.loss.grpo_loss`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from dsv32.agent import Trajectory, run_episode
from dsv32.chat import EOS
from dsv32.engine.memory import release_free_memory
from dsv32.envs.base import Environment, Task
from dsv32.rl.agentic.batcher import LockstepBatcher, RecordingBackend, StepRecord
from dsv32.rl.grpo.rewards.shaping import language_consistency, length_penalty
from dsv32.rl.grpo.rollout import Rollouts, SamplingConfig, layout_rollouts
from dsv32.rl.grpo.tasks import Task as RLTask


def tool_prompt(prompt: str) -> str:
    """Whether the V3.2 tools block is attached: only the ``env`` prompt relies on it."""
    return "attach" if prompt == "env" else "none"


@dataclass
class Episode:
    task: Task
    domain: str
    trajectory: Trajectory
    verifier: float
    records: list[StepRecord]
    reward: float = 0.0
    components: dict[str, float] = field(default_factory=dict)
    scored: bool = (
        True  # False: the environment failed to give a verdict (no advantage, see group_advantages)
    )

    @property
    def generated_tokens(self) -> int:
        return sum(len(r.tokens) for r in self.records)


@dataclass
class EpisodeSettings:
    """How episodes run: the system ``prompt`` (:data:`dsv32.chat.templates.EPISODE_PROMPTS`), ``max_steps`` model calls,
    ``thinking`` mode, a context strategy of :mod:`dsv32.agent.context` with ``context_window``."""

    prompt: str = "env"
    max_steps: int = 4
    thinking: bool = True
    context: str = "none"
    context_window: int | None = None
    tool_timeout_s: float = 30.0


def run_episodes(
    policy,
    jobs: Sequence[tuple[Callable[[], Environment], Task, str]],
    sampling: SamplingConfig,
    settings: EpisodeSettings,
    *,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    keep_routing: bool = False,
    engine=None,
    runner=None,
    keep_indexing: bool = False,
) -> list[Episode]:
    """Run one episode per ``(make_env, task, domain)`` job, all at once (threads, batched model
    calls); returns them in job order. ``generator``: one for all, or one per job (the jobs of a
    group sharing one object: the group's episodes then do not depend on the other jobs, see
    :class:`~dsv32.rl.agentic.batcher.LockstepBatcher`). ``engine``: the :class:`~dsv32.rl.engines.RolloutEngine` that
    samples (default: the policy's model in process); ``keep_indexing``: record the indexer's
    selections (Keep Indexing; DSA in sparse mode); ``runner``: where the environments live
    (:mod:`dsv32.rl.agentic.fanout`: default in this process, or on Ray actors)."""
    if settings.context == "parallel_fewest_step":
        raise ValueError("parallel_fewest_step picks one of several threads: GRPO's group already samples G")
    stop = [policy.tokenizer.convert_tokens_to_ids(EOS)]
    batcher = LockstepBatcher(
        policy, sampling, stop, len(jobs), generator=generator, keep_routing=keep_routing, engine=engine,
        keep_indexing=keep_indexing,
    )  # fmt: skip

    def one(index: int) -> Episode:
        make_env, task, domain = jobs[index]
        try:
            backend = RecordingBackend(
                batcher, index, policy.tokenizer, tool_prompt=tool_prompt(settings.prompt)
            )
            env = make_env() if runner is None else runner.environment(make_env)
            with env:
                trajectory, verdict = run_episode(
                    backend,
                    env,
                    task,
                    prompt=settings.prompt,
                    thinking=settings.thinking,
                    max_steps=settings.max_steps,
                    context=settings.context,
                    context_window=settings.context_window,
                    tool_timeout_s=settings.tool_timeout_s,
                )
            return Episode(task, domain, trajectory, verdict.value, backend.records, scored=verdict.scored)
        finally:
            batcher.leave()

    try:
        with ThreadPoolExecutor(max(1, len(jobs))) as pool:
            return list(pool.map(one, range(len(jobs))))
    finally:  # the batched calls freed their memory in the episode threads' malloc arenas
        release_free_memory()


# ---------------------------------------------------------------------------------------------- rewards
@dataclass
class AgenticReward:
    """``length_weight`` × the length penalty (shape ``length_shape`` against ``budget`` generated
    tokens per episode), ``language_weight`` × language consistency and ``format_weight`` × well-formed
    tool use (1 or 0), added to the verifier."""

    budget: int = 512
    length_weight: float = 0.0
    length_shape: str = "overlong"
    language_weight: float = 0.0
    format_weight: float = 0.0

    def __call__(self, episode: Episode) -> tuple[float, dict[str, float]]:
        text = "\n".join(
            (m.get("reasoning_content") or "") + "\n" + (m.get("content") or "")
            for m in episode.trajectory.messages
            if m.get("role") == "assistant"
        )
        length = length_penalty(episode.generated_tokens, max_tokens=self.budget, shape=self.length_shape)
        language = language_consistency(episode.task.prompt, text)
        form = float(tool_calls_valid(episode.trajectory))
        total = (
            episode.verifier
            + self.length_weight * length
            + self.language_weight * language
            + self.format_weight * form
        )
        return total, {"verifier": episode.verifier, "length": length, "language": language, "format": form}


# ---------------------------------------------------------------------------------------------- rows
@dataclass
class Row:
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    actions: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    kept: list[torch.Tensor] = field(default_factory=list)
    routing: torch.Tensor | None = None
    indexing: torch.Tensor | None = None

    @property
    def ids(self) -> list[int]:
        return self.prompt + self.tokens


def episode_rows(records: Sequence[StepRecord]) -> list[Row]:
    """The training rows of one episode (see the module docstring)."""
    rows: list[Row] = []
    for rec in records:
        row = rows[-1] if rows else None
        if row is None or rec.prompt[: len(row.ids)] != row.ids:
            row = Row(list(rec.prompt))
            rows.append(row)
        else:
            extra = rec.prompt[len(row.ids) :]  # tool results and what reopens the turn: context
            row.tokens += extra
            row.actions += [False] * len(extra)
            row.logprobs += [0.0] * len(extra)
            row.kept.append(torch.full((len(extra), 1), -1, dtype=torch.int32))
        row.tokens += rec.tokens
        row.actions += [True] * len(rec.tokens)
        row.logprobs += rec.logprobs
        k = rec.kept if rec.kept is not None else torch.full((len(rec.tokens), 1), -1, dtype=torch.int32)
        row.kept.append(k.to(torch.int32))
        row.routing = rec.routing  # the last call's routing covers every position of the row
        row.indexing = rec.indexing  # and so do its selections
    return [r for r in rows if any(r.actions)]


def rows_to_rollouts(
    rows: Sequence[Row], tasks: Sequence[RLTask], pad: int, device, *, with_kept: bool
) -> Rollouts:
    """Rows → the :class:`~dsv32.rl.grpo.rollout.Rollouts` layout the GRPO update reads (prompts
    left-padded to a shared ``start``, everything after right-padded)."""
    batch = layout_rollouts(
        tasks, [r.prompt for r in rows], [r.tokens for r in rows], [r.actions for r in rows],
        [r.logprobs for r in rows], [r.kept for r in rows] if with_kept else None, pad, device,
        completions=["" for _ in rows], truncated=[False for _ in rows],
    )  # fmt: skip
    routed = [r.routing for r in rows if r.routing is not None]
    if routed:
        layers, _, topk = routed[0].shape
        width = batch.sequences.shape[1] - 1
        # on ``device`` from the start: the records' routing stays there, no round trip through the host
        routing = torch.zeros(layers, len(rows), width, topk, dtype=routed[0].dtype, device=device)
        for i, r in enumerate(rows):
            if r.routing is not None:
                left = batch.start - len(r.prompt)
                routing[:, i, left : left + r.routing.shape[1]] = r.routing
        batch.routing = routing
    indexed = [r.indexing for r in rows if r.indexing is not None]
    if indexed:
        layers, _, topk = indexed[0].shape
        width = batch.sequences.shape[1] - 1
        indexing = torch.full((layers, len(rows), width, topk), -1, dtype=torch.int32, device=device)
        for i, r in enumerate(rows):
            if r.indexing is not None:
                left = batch.start - len(r.prompt)
                indexing[:, i, left : left + r.indexing.shape[1]] = r.indexing
        batch.indexing = indexing
    return batch


def episode_versions(episodes: Sequence[Episode]) -> list[int | None]:
    """The weight version of each episode that sampled anything (one whose environment failed
    before the first model call has none to check): the oldest of its model calls, None when one
    call's engine reported none."""
    out: list[int | None] = []
    for e in episodes:
        versions = [r.weight_version for r in e.records]
        if versions:
            out.append(None if None in versions else min(versions))
    return out


def rl_task(episode: Episode) -> RLTask:
    """The rollout's task record (its domain selects the KL strength)."""
    t = episode.task
    return RLTask(
        id=t.id, domain=episode.domain, prompt=t.prompt, answer=None if t.answer is None else str(t.answer)
    )


def tool_calls_valid(trajectory: Trajectory) -> bool:
    """The episode called a tool and every call was well formed: each model reply parsed as V3.2
    without problems and every call named a tool with valid arguments."""
    calls = [c for s in trajectory.steps for c in s.tool_calls]
    if not calls:
        return False
    parsed = all(not s.problems for s in trajectory.steps)
    return parsed and all(
        c.ok or c.error not in ("unknown_tool", "bad_json", "invalid_arguments") for c in calls
    )


def episode_outcome(e: Episode) -> dict[str, Any]:
    """One episode in a line: its task, whether it was solved, used a tool and used it well formed,
    its model calls, generated tokens and why it stopped (stages compare task by task)."""
    return {
        "id": e.task.id,
        "correct": e.verifier >= 1.0,
        "tool_call_valid": tool_calls_valid(e.trajectory),
        "used_tool": any(s.tool_calls for s in e.trajectory.steps),
        "steps": e.trajectory.num_steps,
        "tokens": e.generated_tokens,
        "stop": e.trajectory.stop_reason,
    }


def episode_summary(episodes: Sequence[Episode]) -> dict[str, Any]:
    """Accuracy (verifier = 1), well-formed tool use, steps, tokens, stop reasons, and each
    episode's :func:`episode_outcome` (``outcomes``, in order)."""
    return outcome_summary([episode_outcome(e) for e in episodes], sum(not e.scored for e in episodes))


def outcome_summary(outcomes: Sequence[dict[str, Any]], not_scored: int) -> dict[str, Any]:
    """The shares and means over episodes' :func:`episode_outcome` rows, their stop reasons, and the
    rows themselves (``outcomes``, in order)."""
    n = max(1, len(outcomes))
    stops: dict[str, int] = {}
    for o in outcomes:
        stops[o["stop"]] = stops.get(o["stop"], 0) + 1
    return {
        "episodes": len(outcomes),
        "accuracy": sum(o["correct"] for o in outcomes) / n,
        "tool_call_valid": sum(o["tool_call_valid"] for o in outcomes) / n,
        "used_tool": sum(o["used_tool"] for o in outcomes) / n,
        "mean_steps": sum(o["steps"] for o in outcomes) / n,
        "mean_generated_tokens": sum(o["tokens"] for o in outcomes) / n,
        "stop_reasons": stops,
        "not_scored": not_scored,
        "outcomes": list(outcomes),
    }


def concat_rollouts(a: Rollouts, b: Rollouts, pad: int) -> Rollouts:
    """Two rollout batches as one (rows of ``a`` then ``b``), re-laid out to a shared ``start``."""
    P, T = max(a.start, b.start), max(a.action_mask.shape[1], b.action_mask.shape[1])
    parts = [_relayout(r, P, T, pad) for r in (a, b)]
    kept = None
    if a.kept_ids is not None or b.kept_ids is not None:
        K = max(p["kept"].shape[-1] for p in parts if p["kept"] is not None)
        kept = torch.cat(
            [
                torch.nn.functional.pad(p["kept"], (0, K - p["kept"].shape[-1]), value=-1)
                if p["kept"] is not None
                else torch.full((len(r), T, K), -1, dtype=torch.int32, device=r.sequences.device)
                for p, r in zip(parts, (a, b))
            ]
        )
    routing = None
    if a.routing is not None and b.routing is not None:
        routing = torch.cat([p["routing"] for p in parts], 1)
    elif a.routing is not None or b.routing is not None:
        raise ValueError("cannot join a batch with Keep Routing records to one without")
    indexing = None
    if a.indexing is not None and b.indexing is not None:
        indexing = torch.cat([p["indexing"] for p in parts], 1)
    elif a.indexing is not None or b.indexing is not None:
        raise ValueError("cannot join a batch with Keep Indexing records to one without")
    return Rollouts(
        tasks=a.tasks + b.tasks,
        sequences=torch.cat([p["seq"] for p in parts]),
        attention_mask=torch.cat([p["mask"] for p in parts]),
        start=P,
        action_mask=torch.cat([p["action"] for p in parts]),
        sampling_logprobs=torch.cat([p["logp"] for p in parts]),
        kept_ids=kept,
        routing=routing,
        completions=a.completions + b.completions,
        num_tokens=a.num_tokens + b.num_tokens,
        truncated=a.truncated + b.truncated,
        indexing=indexing,
    )


def _relayout(r: Rollouts, P: int, T: int, pad: int) -> dict[str, Any]:
    """``r``'s tensors with prompts ending at column ``P`` and ``T`` completion columns."""
    B, (_, Tr), off = len(r), r.action_mask.shape, P - r.start
    dev = r.sequences.device
    seq = torch.full((B, P + T), pad, dtype=torch.long, device=dev)
    seq[:, off : P + Tr] = r.sequences
    mask = torch.zeros(B, P + T, dtype=r.attention_mask.dtype, device=dev)
    mask[:, off : P + Tr] = r.attention_mask
    action = torch.zeros(B, T, dtype=torch.bool, device=dev)
    action[:, :Tr] = r.action_mask
    logp = torch.zeros(B, T, device=dev)
    logp[:, :Tr] = r.sampling_logprobs
    kept = None
    if r.kept_ids is not None:
        kept = torch.full((B, T, r.kept_ids.shape[-1]), -1, dtype=torch.int32, device=dev)
        kept[:, :Tr] = r.kept_ids
    routing = None
    if r.routing is not None:
        layers, _, _, k = r.routing.shape
        routing = torch.zeros(layers, B, P + T - 1, k, dtype=r.routing.dtype, device=dev)
        routing[:, :, off : off + r.routing.shape[2]] = r.routing
    indexing = None
    if r.indexing is not None:
        layers, _, _, k = r.indexing.shape
        indexing = torch.full((layers, B, P + T - 1, k), -1, dtype=torch.int32, device=dev)
        indexing[:, :, off : off + r.indexing.shape[2]] = r.indexing
    return {
        "seq": seq, "mask": mask, "action": action, "logp": logp, "kept": kept, "routing": routing,
        "indexing": indexing,
    }  # fmt: skip
