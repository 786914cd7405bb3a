"""Rollouts: G samples per prompt from the current policy, with what the GRPO update needs.

Each sample records, per generated token, the sampling log-probability returned by the engine
(π_old in Eq. 9), the token set kept by top-k/top-p (Keep Sampling Mask) and, for the native MoE
model, the experts every position was routed to (Keep Routing). All rows of a batch share one layout:
left-padded prompts in columns ``[0, start)``, then the completion in ``[start, L)``, right-padded.

Multi-turn tool use goes through a :class:`TurnHook`: after each generated turn the hook sees the
completion so far and may return text to append (a rendered tool result, plus whatever opens the next
assistant turn); the policy then continues. Appended tokens are part of the context but not actions
(``action_mask`` 0), so the loss never trains on tool output. The environments that produce such text
arrive with the agent issues; any callable with this signature plugs in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from dsv32.engine.sampling import GREEDY_BELOW
from dsv32.recipe import NON_NEGATIVE, OPEN_UNIT, Checked, Rule, at_least
from dsv32.rl.engines import InProcessEngine, RolloutEngine, WarnOnce, run_calls, split_calls
from dsv32.rl.grpo.policy import Policy
from dsv32.rl.grpo.tasks import Task, TaskError

TurnHook = Callable[[Task, str, int], "str | None"]
"""``hook(task, completion_so_far, turn) -> text to append, or None to end the episode``."""


@dataclass
class SamplingConfig(Checked):
    """How rollouts are sampled (the paper samples with top-p and keeps its mask).

    ``max_new_tokens`` bounds each turn; ``max_turns`` the turns of a multi-turn episode;
    ``max_total_tokens`` the whole completion (turns + appended tool text)."""

    RANGES: ClassVar[dict[str, Rule]] = {
        # the engine decodes greedily below GREEDY_BELOW, where the loss's logits / T would not match
        "temperature": Rule(lambda v: v == 0 or v >= GREEDY_BELOW, f"0 (greedy) or >= {GREEDY_BELOW:g}"),
        "top_p": OPEN_UNIT,
        "top_k": NON_NEGATIVE,
        "max_new_tokens": at_least(1),
        "max_turns": at_least(1),
        "max_total_tokens": at_least(1),
    }

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    max_turns: int = 1
    max_total_tokens: int = 1024


def truncates(sampling) -> bool:
    """Whether sampling with ``sampling``'s ``temperature``, ``top_p`` and ``top_k`` truncates the
    distribution: only then do kept sets matter (greedy keeps the argmax: nothing to renormalize)."""
    return sampling.temperature >= GREEDY_BELOW and (sampling.top_p < 1.0 or sampling.top_k > 0)


@dataclass
class Rollouts:
    """A batch of B = prompts × G samples (rows of one group are consecutive).

    - ``sequences`` / ``attention_mask`` ``[B, L]``: prompt (left-padded) + completion (right-padded);
    - ``start``: first completion column; the loss tensors below are ``[B, T]`` with ``T = L - start``;
    - ``action_mask`` ``[B, T]``: tokens the policy generated (the loss runs over these only);
    - ``sampling_logprobs`` ``[B, T]``: the engine's log-probs (0 off the actions);
    - ``kept_ids`` ``[B, T, K]`` −1-padded kept sets, or None (sampling without truncation);
    - ``routing`` ``[num_moe_layers, B, L - 1, k]`` recorded experts, or None;
    - ``indexing`` ``[DSA layers, B, L - 1, index_topk]`` ``int32`` recorded selections as row positions
      (Keep Indexing, :mod:`dsv32.dsa.keep`; −1 empty), or None;
    - ``completions``: decoded completion per row (appended tool text included); ``num_tokens``:
      generated tokens per row; ``truncated``: the episode hit a token budget before its end token;
    - ``weight_versions``: per row, the (oldest) weight version the engine sampled it with, or None;
      ``staleness``: per row, how many versions that lags the trainer's (set by the trainer).
    """

    tasks: list[Task]
    sequences: torch.Tensor
    attention_mask: torch.Tensor
    start: int
    action_mask: torch.Tensor
    sampling_logprobs: torch.Tensor
    kept_ids: torch.Tensor | None
    routing: torch.Tensor | None
    completions: list[str]
    num_tokens: list[int]
    truncated: list[bool]
    weight_versions: list[int | None] | None = None
    staleness: list[int] | None = None
    indexing: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.sequences.shape[0]

    def rows(self, idx: torch.Tensor) -> dict:
        """The tensors of rows ``idx`` as keyword arguments of :meth:`Policy.action_logprobs`."""
        return {
            "sequences": self.sequences[idx],
            "attention_mask": self.attention_mask[idx],
            "start": self.start,
            "kept_ids": None if self.kept_ids is None else self.kept_ids[idx],
            "routing": None if self.routing is None else self.routing[:, idx],
            "indexing": None if self.indexing is None else self.indexing[:, idx],
            "action_mask": self.action_mask[idx],
        }


_warn = WarnOnce()


def generation_budget(sampling: SamplingConfig) -> int:
    """The most tokens a rollout appends to a prompt (one turn, or all turns and tool text)."""
    return sampling.max_new_tokens if sampling.max_turns == 1 else sampling.max_total_tokens


def check_context(policy: Policy, tasks: Sequence[Task], budget: int, prompts=None) -> None:
    """Raise :class:`TaskError` naming the first task whose prompt plus ``budget`` generated tokens
    does not fit the model's ``max_position_embeddings`` (positions past it are not trained)."""
    window = getattr(getattr(policy.model, "config", None), "max_position_embeddings", None)
    if not isinstance(window, int):
        return
    for i, task in enumerate(tasks):
        n = len(prompts[i] if prompts is not None else policy.prompt_ids(task))
        if n + budget > window:
            raise TaskError(
                f"task {task.id!r} (domain {task.domain!r}): its prompt is {n} tokens and up to {budget} "
                f"are generated, {n + budget} > the model's window of {window} tokens "
                "(max_position_embeddings): shorten the prompt or lower the generation budget "
                "(max_new_tokens / max_total_tokens)"
            )


def rollout(
    policy: Policy,
    tasks: list[Task],
    group_size: int,
    sampling: SamplingConfig,
    *,
    generator: torch.Generator | None = None,
    keep_routing: bool = False,
    hook: TurnHook | None = None,
    engine: RolloutEngine | None = None,
    group_generators: Sequence[torch.Generator] | None = None,
    keep_indexing: bool = False,
) -> Rollouts:
    """Sample ``group_size`` completions for each task (one batched ``engine.generate`` per turn;
    default engine: the policy's own model, in process). An engine that returns no kept sets / no
    routing gives a batch without them (``kept_ids`` / ``routing`` None), said once in the log.

    ``group_generators`` (one per task, instead of ``generator``): each task's group draws from its own
    generator — in the in-process engine's one batched call (:func:`dsv32.engine.generate` with a
    generator per row), in concurrent engine calls of its own with another engine — so a group's samples do not
    depend on which other tasks share the batch: a batch split by whole groups over several processes
    samples exactly what one process samples. ``keep_indexing``: record the indexer's selections
    (Keep Indexing; a policy with DSA in sparse mode), single-turn rollouts only."""
    if group_generators is not None and len(group_generators) != len(tasks):
        raise ValueError(f"group_generators: {len(group_generators)} generators for {len(tasks)} tasks")
    engine = engine if engine is not None else InProcessEngine(policy.model)
    if keep_routing and policy.kind != "native":
        raise ValueError("keep_routing needs the native MoE model (HF policies are dense)")
    if keep_routing and hook is not None and sampling.max_turns > 1:
        raise ValueError("Keep Routing is recorded for single-turn rollouts only")
    if keep_indexing and hook is not None and sampling.max_turns > 1:
        raise ValueError("Keep Indexing is recorded for single-turn rollouts only")
    rows = [t for t in tasks for _ in range(group_size)]
    rendered = [policy.prompt_ids(t) for t in tasks]
    check_context(policy, tasks, generation_budget(sampling), rendered)
    prompts = [ids for ids in rendered for _ in range(group_size)]  # rendered once per task
    params = dict(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
    truncating = truncates(sampling)
    pad = policy.pad_token_id
    # Per row: completion tokens, which are actions, their logprobs and kept sets.
    tokens: list[list[int]] = [[] for _ in rows]
    actions: list[list[bool]] = [[] for _ in rows]
    logps: list[list[float]] = [[] for _ in rows]
    kept: list[list[torch.Tensor]] = [[] for _ in rows]
    truncated = [False] * len(rows)
    routing = None
    routed: list[tuple[list[int], torch.Tensor | None]] = []  # (rows, the call's routing)
    indexed: list[tuple[list[int], torch.Tensor | None]] = []  # (rows, the call's selections)
    versions: list[int | None] = [None] * len(rows)
    active = list(range(len(rows)))
    for turn in range(sampling.max_turns):
        active = [i for i in active if len(tokens[i]) < sampling.max_total_tokens]
        if not active:
            break
        per_row = None if group_generators is None else [group_generators[i // group_size] for i in active]
        calls = split_calls(engine, active, generator if per_row is None else per_row)
        kw = dict(params, eos=policy.eos_token_id, pad=policy.pad_token_id, turn=turn)
        kw |= dict(return_routing=keep_routing, return_kept=truncating)
        if keep_indexing:
            kw["return_indexing"] = True

        def generate(call, kw=kw):
            call_rows, gen = call
            n_new = min(
                sampling.max_new_tokens, max(sampling.max_total_tokens - len(tokens[i]) for i in call_rows)
            )
            return engine.generate(
                [prompts[i] + tokens[i] for i in call_rows], max_new_tokens=n_new, generator=gen, **kw
            )

        outs = run_calls(calls, generate)  # applied in order below
        still = []
        for (call_rows, _), out in zip(calls, outs):
            if keep_indexing:
                indexed.append((call_rows, out.indexing))
            more, kept_sets = _apply_turn(
                engine, out, call_rows, rows, tokens, actions, logps, kept, truncated, versions, routed,
                sampling, policy, hook, turn, keep_routing, truncating,
            )  # fmt: skip
            still += more
            if truncating and not kept_sets:
                truncating, kept = False, [[] for _ in rows]
        active = sorted(still)
    if keep_routing and routed and all(r is not None for _, r in routed):
        routing = _place_routing(routed, prompts, max(1, max(len(t) for t in tokens)))
    elif keep_routing:
        _warn(
            f"routing:{engine.name}",
            f"rollouts: the {engine.name} engine returned no routed experts: no Keep Routing",
        )
    indexing = None
    if keep_indexing and indexed and all(r is not None for _, r in indexed):
        indexing = _place_routing(indexed, prompts, max(1, max(len(t) for t in tokens)), fill=-1)
    elif keep_indexing:
        _warn(
            f"indexing:{engine.name}",
            f"rollouts: the {engine.name} engine returned no indexer selections: no Keep Indexing",
        )
    batch = layout_rollouts(
        rows, prompts, tokens, actions, logps, kept if truncating else None, pad, policy.device,
        completions=[policy.decode(t) for t in tokens], truncated=truncated,
    )  # fmt: skip
    batch.weight_versions = versions
    if routing is not None:
        batch.routing = routing.to(policy.device)
    if indexing is not None:
        batch.indexing = indexing.to(policy.device)
    return batch


def _place_routing(
    routed: list[tuple[list[int], torch.Tensor]], prompts, T: int, fill: int = 0
) -> torch.Tensor:
    """The routing (or the selections) of each engine call (its own layout: its prompts left-padded
    to its longest, width ``P_call + N_call - 1``) placed into the batch's layout
    ``[layers, B, P + T - 1, k]``; ``fill`` where nothing was recorded."""
    P = max(len(p) for p in prompts)
    first = routed[0][1]
    out = first.new_full((first.shape[0], len(prompts), P + T - 1, first.shape[-1]), fill)
    for call_rows, r in routed:
        shift = P - max(len(prompts[i]) for i in call_rows)
        width = min(r.shape[2], out.shape[2] - shift)
        idx = torch.tensor(call_rows, device=out.device)
        out[:, idx, shift : shift + width] = r[:, :, :width].to(out.device)
    return out


def _apply_turn(
    engine, out, call_rows, rows, tokens, actions, logps, kept, truncated, versions, routed,
    sampling, policy, hook, turn, keep_routing, truncating,
) -> tuple[list[int], bool]:  # fmt: skip
    """One ``engine.generate`` output for ``call_rows``: their new tokens appended (and the hook's
    text after an ended turn); returns the rows whose episode continues and whether the engine
    returned kept sets (when they were asked for)."""
    if truncating and out.kept is None:
        _warn(
            f"kept:{engine.name}",
            f"rollouts: the {engine.name} engine returned no kept sampling sets: "
            "no Keep Sampling Mask is applied to its samples",
        )
        truncating = False
    if keep_routing:
        routed.append((call_rows, out.routing))
    eos = policy.eos_token_id
    still = []
    for j, i in enumerate(call_rows):
        v = out.weight_version
        versions[i] = v if turn == 0 or versions[i] is None or v is None else min(versions[i], v)
        n = min(len(out.tokens[j]), sampling.max_total_tokens - len(tokens[i]))
        new = out.tokens[j][:n]
        ended = n > 0 and new[-1] in eos
        tokens[i] += new
        actions[i] += [True] * n
        logps[i] += out.logprobs[j][:n]
        if truncating:
            kept[i].append(out.kept[j][:n])
        if not ended:
            truncated[i] = True  # cut by the token budget (the episode may still continue below)
        if hook is not None and ended and turn + 1 < sampling.max_turns:
            text = hook(rows[i], policy.decode(tokens[i]), turn)
            if text:
                extra = policy.encode(text)[: max(0, sampling.max_total_tokens - len(tokens[i]))]
                tokens[i] += extra
                actions[i] += [False] * len(extra)
                logps[i] += [0.0] * len(extra)
                if truncating:
                    kept[i].append(torch.full((len(extra), 1), -1, dtype=torch.int32))
                truncated[i] = False
                still.append(i)
    return still, truncating


def layout_rollouts(
    tasks: Sequence[Task],
    prompts: Sequence[list[int]],
    tokens: Sequence[list[int]],
    actions: Sequence[list[bool]],
    logps: Sequence[list[float]],
    kept: Sequence[list[torch.Tensor]] | None,
    pad: int,
    device,
    *,
    completions: list[str],
    truncated: list[bool],
) -> Rollouts:
    """Per-row prompt ids, completion tokens with their action flags, sampling log-probs and kept
    sets (``[n, K]`` pieces, on any device, or None) → the :class:`Rollouts` layout on ``device``:
    prompts left-padded to end at ``start``, completions right-padded. ``routing`` is left None."""
    B = len(prompts)
    P = max(len(p) for p in prompts)
    T = max(1, max(len(t) for t in tokens))
    seq = torch.full((B, P + T), pad, dtype=torch.long)
    mask = torch.zeros(B, P + T, dtype=torch.long)
    action = torch.zeros(B, T, dtype=torch.bool)
    logp = torch.zeros(B, T)
    kept_ids = None
    if kept is not None:
        K = max((k.shape[-1] for ks in kept for k in ks if k.numel()), default=1)
        kept_ids = torch.full((B, T, K), -1, dtype=torch.int32)
    for i in range(B):
        p, t = prompts[i], tokens[i]
        seq[i, P - len(p) : P] = torch.tensor(p)
        mask[i, P - len(p) : P + len(t)] = 1
        if t:
            seq[i, P : P + len(t)] = torch.tensor(t)
            action[i, : len(t)] = torch.tensor(actions[i])
            logp[i, : len(t)] = torch.tensor(logps[i])
            if kept_ids is not None:
                pieces = [k.to(kept_ids.device) for k in kept[i]]  # engine's device, or CPU (context)
                cat = [torch.nn.functional.pad(k, (0, K - k.shape[-1]), value=-1) for k in pieces]
                kept_ids[i, : len(t)] = torch.cat(cat)
    return Rollouts(
        tasks=list(tasks),
        sequences=seq.to(device),
        attention_mask=mask.to(device),
        start=P,
        action_mask=action.to(device),
        sampling_logprobs=logp.to(device),
        kept_ids=None if kept_ids is None else kept_ids.to(device),
        routing=None,
        completions=completions,
        num_tokens=[sum(a) for a in actions],
        truncated=truncated,
    )
