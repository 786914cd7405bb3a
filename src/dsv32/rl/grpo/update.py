"""The mini-batch updates of one GRPO rollout batch (paper §3.1): Eq. 8 over mini-batches of outputs,
each split into micro-batches whose gradients sum to the mini-batch's, then one optimizer step.

A step whose loss or gradient norm is not finite is skipped (its gradients are dropped and the
weights left as they were) and counted as ``skipped_updates``; :class:`UpdateGuard` stops the run
with :class:`NonFiniteUpdateError` after ``grpo.max_skipped_updates`` such steps in a row. The guard
lives in :mod:`dsv32.training_guard` (every trainer shares it); its names are re-exported here."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from dsv32 import distributed
from dsv32.rl.grpo.config import GRPOConfig
from dsv32.rl.grpo.indexing import indexer_losses
from dsv32.rl.grpo.loss import OutputTotals, grpo_loss, output_index, sequence_kl_coefs
from dsv32.rl.grpo.policy import Policy
from dsv32.rl.grpo.rollout import Rollouts
from dsv32.training_guard import NonFiniteUpdateError, UpdateGuard, check_finite_weights

#: What a user can change when GRPO updates stay non-finite (the guard's message ends with it).
RL_ADVICE = "lower grpo.lr, set grpo.clip_grad, or check the rewards and the model's dtype"
#: What to do when the policy's weights are found non-finite before a checkpoint.
RL_WEIGHTS_ADVICE = "resume from the last checkpoint with a lower grpo.lr or a tighter grpo.clip_grad"


def rl_guard(limit: int) -> UpdateGuard:
    """The :class:`UpdateGuard` of a GRPO run: ``grpo.max_skipped_updates`` in a row stop it."""
    return UpdateGuard(limit, advice=RL_ADVICE)


def check_finite_policy(model: torch.nn.Module, step: int) -> None:
    """:func:`check_finite_weights` for the policy, with GRPO's advice. Under ``torchrun`` every rank
    raises when one rank's shard is not finite (none goes on to a collective the others left)."""
    local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
    finite = not local or bool(torch.stack([torch.isfinite(p).all() for p in local]).all())
    if distributed.all_true(finite):
        return
    check_finite_weights(model, step, whose="policy's", advice=RL_WEIGHTS_ADVICE)
    raise NonFiniteUpdateError(  # this rank's shard is finite, another's is not
        f"after step {step} the policy's weights hold NaN or inf (in another process's shard); no "
        f"checkpoint or model is written from them: {RL_WEIGHTS_ADVICE}"
    )


def grpo_update(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    batch: Rollouts,
    advantages: torch.Tensor,
    cfg: GRPOConfig,
    *,
    temperature: float,
    ref: Policy | None,
    generator: torch.Generator,
    sequence_ids: torch.Tensor | None = None,
    global_ids: bool = False,
    guard: UpdateGuard | None = None,
    frozen_trunk: bool = True,
) -> list[dict]:
    """The mini-batch updates of one rollout batch; returns one metrics dict per optimizer step. The KL
    term (per-domain β of ``cfg``) is against the frozen ``ref`` policy; none without one. A step with
    a non-finite loss or gradient norm is skipped (``skipped_updates`` 1 in its dict); ``guard``
    counts such steps in a row across calls (None: a fresh one with ``cfg.max_skipped_updates``).

    ``sequence_ids`` ``[B]``: rows with the same id are pieces of one output o_i (an agentic episode
    laid out in several rows); None: every row is an output of its own. Mini-batches are drawn over
    outputs, so all rows of an output are in the same optimizer step. Within a mini-batch, rows go
    through the model ``micro_batch`` at a time, and an output's rows may fall in different
    micro-batches: each micro-batch's :func:`grpo_loss` gets the mini-batch's
    :class:`~dsv32.rl.grpo.loss.OutputTotals` (|o_i| and the number of outputs counted over the whole
    mini-batch), so its loss is its exact share of the mini-batch's Eq. 8 and the summed gradient,
    like the metrics, does not depend on how the rows are split. Eq. 9 decides M_i on the divergence
    over all of o_i's tokens under the current π_θ: for an output with negative advantage (the only
    ones Eq. 9 can mask) whose rows span several micro-batches, a no-grad forward of its rows first
    gives each micro-batch the part of that divergence outside it (only with OPSM on).

    Under ``torchrun`` each rank holds whole outputs and the mini-batches are drawn over the global
    batch of outputs (the same permutation on every rank): rank by rank, or, with ``global_ids``,
    ordered by ``sequence_ids``, which then number the outputs over all ranks (distinct between
    ranks; say item ``k``'s ``j``-th output is ``k·G + j``), so that one process and several order
    the outputs alike however each rank lays out its rows.

    With ``frozen_trunk`` (one process, an HF policy whose embeddings and lowest layers are frozen:
    :meth:`Policy.frozen_trunk`), those layers run once per row for the whole call
    (:meth:`Policy.trunk_states`), and every forward of the call — the policy's, OPSM's no-grad ones
    and the reference's when it holds the same lowest layers — runs only the layers above. False:
    every forward runs every layer (the same values up to float rounding)."""
    B = len(batch)
    device = batch.action_mask.device
    ids = torch.arange(B, device=device) if sequence_ids is None else sequence_ids.to(device)
    if ids.shape != (B,):
        raise ValueError(f"sequence_ids must have shape [{B}] (one per row), got {list(ids.shape)}")
    output_of_row, n_outputs = output_index(ids, B, device)
    position, n_global = _global_positions(ids, n_outputs, global_ids)
    local_of = torch.full((n_global,), -1, dtype=torch.long, device=device)
    local_of[position.to(device)] = torch.arange(n_outputs, device=device)
    trunk = _trunk(policy, batch, cfg.micro_batch) if frozen_trunk else None
    ref_trunk = (
        trunk if trunk is not None and ref is not None and policy.shares_trunk(ref, trunk[1]) else None
    )
    ref_logprobs = _batch_logprobs(ref, batch, cfg, temperature, ref_trunk) if ref is not None else None
    domains = [t.domain for t in batch.tasks]
    old = (
        _batch_logprobs(policy, batch, cfg, temperature, trunk)
        if cfg.old_logprobs == "recompute"
        else batch.sampling_logprobs
    )
    predicts = _predicting_queries(batch.attention_mask)
    u = _Update(
        policy=policy,
        optimizer=optimizer,
        batch=batch,
        advantages=advantages,
        cfg=cfg,
        temperature=temperature,
        ids=ids,
        output_of_row=output_of_row,
        n_outputs=n_outputs,
        ref_logprobs=ref_logprobs,
        kl_coefs=sequence_kl_coefs(domains, cfg.domain_kl_coef, default=cfg.kl_coef).to(device),
        kept=batch.kept_ids if cfg.keep_sampling_mask else None,
        routing=batch.routing if cfg.keep_routing else None,
        indexing=_emptied(batch.indexing, predicts) if cfg.keep_indexing else None,
        queries=predicts.sum(1),
        old=old,
        trunk=trunk,
        guard=guard if guard is not None else rl_guard(cfg.max_skipped_updates),
    )
    size = max(1, n_global // cfg.mini_batches)
    records = []
    for _ in range(cfg.epochs):
        order = torch.randperm(n_global, generator=generator).to(device)
        for chosen in order.split(size):
            outputs = local_of[chosen]
            records.append(_mini_batch(u, outputs[outputs >= 0]))  # this rank's outputs, in its order
    return records


@dataclass
class _Update:
    """What every mini-batch of one :func:`grpo_update` call reads: the batch, each row's output
    (``ids``, ``output_of_row``), π_ref's and π_old's log-probs, the per-row β, the kept sets,
    routing and indexer selections replayed (None: off), the frozen trunk's states."""

    policy: Policy
    optimizer: torch.optim.Optimizer
    batch: Rollouts
    advantages: torch.Tensor
    cfg: GRPOConfig
    temperature: float
    ids: torch.Tensor
    output_of_row: torch.Tensor
    n_outputs: int
    ref_logprobs: torch.Tensor | None
    kl_coefs: torch.Tensor
    kept: torch.Tensor | None
    routing: torch.Tensor | None
    indexing: torch.Tensor | None
    queries: torch.Tensor
    old: torch.Tensor
    trunk: tuple[torch.Tensor, int] | None
    guard: UpdateGuard


def _mini_batch(u: _Update, outputs: torch.Tensor) -> dict:
    """One optimizer step over this rank's ``outputs`` of a mini-batch: its rows through the model
    ``micro_batch`` at a time, the gradients summed, clipped and applied unless non-finite."""
    batch, cfg, ids = u.batch, u.cfg, u.ids
    mask, device = batch.action_mask, batch.action_mask.device
    mb = _rows_of(outputs, u.output_of_row, u.n_outputs)
    mb = _by_length(batch, mb)  # the sums do not depend on how the rows are split
    totals = OutputTotals.of(mask[mb], ids[mb])
    n_out, n_tok, n_query = distributed.all_sum(
        [totals.outputs, int(mask[mb].sum()), int(u.queries[mb].sum())]
    )
    totals = replace(totals, outputs=int(n_out))  # Eq. 8 averages over the global mini-batch
    mb_tokens = max(1, int(n_tok))
    parts = [p for p in torch.arange(len(mb), device=device).split(cfg.micro_batch) if len(p)]
    n_parts = int(distributed.all_max([len(parts)])[0])  # every rank runs as many forwards
    rests: list = [None] * len(parts)
    if cfg.opsm_delta is not None:
        rests = _log_ratio_rest(
            u.policy, batch, mb, ids[mb], u.advantages[mb], parts, u.kept, u.routing, u.temperature,
            cfg.micro_batch, u.trunk, u.indexing,
        )  # fmt: skip
    sums: dict[str, float] = dict.fromkeys(_SHARE_METRICS + _TOKEN_METRICS, 0.0)
    sums |= {"ratio_max": -math.inf, "ratio_min": math.inf}
    finite = torch.ones((), dtype=torch.bool, device=device)
    for k in range(n_parts):
        distributed.set_gradient_sync(u.policy.model, k == n_parts - 1)  # one reduce per update
        if k >= len(parts):  # this rank has no rows left: a forward/backward that adds nothing
            _idle_pass(
                u.policy, batch, u.kept, u.routing, u.temperature, grad=True, indexing=u.indexing,
                indexer_loss=cfg.indexer_loss,
            )  # fmt: skip
            continue
        share = int(u.queries[mb[parts[k]]].sum()) / max(1, int(n_query))  # the indexer loss's weight
        finite &= _micro_batch(u, mb[parts[k]], totals.part(parts[k], rests[k]), sums, mb_tokens, share)
    keys = _SHARE_METRICS + _TOKEN_METRICS
    if cfg.indexer_loss and distributed.all_max(["indexer_loss" in sums])[0]:  # a rank may hold no rows
        keys += ("indexer_loss",)
        sums.setdefault("indexer_loss", 0.0)
    sums |= dict(zip(keys, distributed.all_sum([sums[key] for key in keys])))
    high, low = distributed.all_max([sums["ratio_max"], -sums["ratio_min"]])
    sums["ratio_max"], sums["ratio_min"] = high, -low
    groups = u.optimizer.param_groups
    params = [p for g in groups if g.get("side") != "indexer" for p in g["params"]]
    norm = distributed.clip_grad_norm(params, cfg.clip_grad or math.inf)
    sums["grad_norm"] = norm
    indexer = [p for g in groups if g.get("side") == "indexer" for p in g["params"]]
    if indexer:  # clipped on its own, as in the sparse stage: its loss is not the policy's
        index_norm = distributed.clip_grad_norm(indexer, cfg.clip_grad or math.inf)
        sums["grad_norm_indexer"] = index_norm
        norm = max(norm, index_norm) if math.isfinite(index_norm) else index_norm
        for g in groups:  # the policy's schedule, at the indexer's own rate
            if g.get("side") == "indexer":
                g["lr"] = groups[0]["lr"] * cfg.indexer_lr / cfg.lr
    ok = u.guard.allows(distributed.all_true(bool(finite)) and math.isfinite(norm), norm)
    if ok:  # a NaN/inf step would poison the weights and AdamW's moments for good
        u.optimizer.step()
    u.optimizer.zero_grad(set_to_none=True)
    sums["skipped_updates"] = 0.0 if ok else 1.0
    return sums


def _micro_batch(
    u: _Update, micro: torch.Tensor, totals: OutputTotals, sums: dict, mb_tokens: int, share: float = 1.0
) -> torch.Tensor:
    """The forward and backward of rows ``micro`` (their share of the mini-batch's loss), their
    metrics added to ``sums``; returns whether the loss was finite. With ``grpo.indexer_loss`` the
    forward also gives each DSA layer's indexer loss (Eq. 4 over the selection attended to), whose
    mean over the layers joins the backward weighted by ``share``, the micro-batch's part of the
    global mini-batch's predicting queries, so the indexer loss is the mini-batch's mean over them in
    any split into micro-batches and ranks (the two losses reach disjoint parameters: see
    :mod:`dsv32.rl.grpo.indexing`)."""
    batch, cfg, mask = u.batch, u.cfg, u.batch.action_mask
    with indexer_losses(u.policy.model, cfg.indexer_loss) as layer_losses:
        logp = u.policy.action_logprobs(
            **_rows(batch, micro, u.kept, u.routing, u.trunk, u.indexing), temperature=u.temperature
        )
    loss, m = grpo_loss(
        logp,
        u.old[micro],
        u.advantages[micro],
        mask[micro],
        ref_logprobs=None if u.ref_logprobs is None else u.ref_logprobs[micro],
        sampling_logprobs=batch.sampling_logprobs[micro],
        clip_eps=cfg.clip_eps,
        kl_coef=u.kl_coefs[micro] if u.ref_logprobs is not None else 0.0,
        kl_estimator=cfg.kl_estimator,
        opsm_delta=cfg.opsm_delta,
        sequence_ids=u.ids[micro],
        totals=totals,
    )
    if layer_losses:
        index_loss = sum(layer_losses.values()) / len(layer_losses) * share
        loss = loss + index_loss
        sums["indexer_loss"] = sums.get("indexer_loss", 0.0) + float(index_loss.detach())
    loss.backward()  # already this micro-batch's share of the mini-batch's loss
    m["abs_log_ratio"] = _abs_log_ratio(logp.detach(), u.old[micro], mask[micro])
    for key in _SHARE_METRICS:
        sums[key] += m[key]
    for key in _TOKEN_METRICS:  # means over this micro-batch's tokens: weight by them
        sums[key] += m[key] * m["tokens"] / mb_tokens
    sums["ratio_max"] = max(sums["ratio_max"], m["ratio_max"])
    sums["ratio_min"] = min(sums["ratio_min"], m["ratio_min"])
    return torch.isfinite(loss.detach())


def _global_positions(ids: torch.Tensor, n_outputs: int, global_ids: bool) -> tuple[torch.Tensor, int]:
    """The position of each of this rank's outputs (numbered as :func:`output_index` does) in the
    global batch, and the global number of outputs: rank by rank, or by id with ``global_ids``."""
    if not global_ids:
        counts = distributed.all_gather_objects(n_outputs)
        offset = sum(counts[: distributed.world().rank])
        return torch.arange(offset, offset + n_outputs), sum(counts)
    mine = torch.unique(ids).tolist()  # sorted: output_index's numbering
    every = sorted(k for part in distributed.all_gather_objects(mine) for k in part)
    if len(set(every)) != len(every):
        raise ValueError("global_ids: two processes hold outputs with the same sequence id")
    where = {k: i for i, k in enumerate(every)}
    return torch.tensor([where[k] for k in mine], dtype=torch.long), len(every)


def _idle_pass(
    policy: Policy,
    batch: Rollouts,
    kept,
    routing,
    temperature: float,
    grad: bool,
    indexing=None,
    indexer_loss: bool = False,
) -> None:
    """A forward (and, with ``grad``, a backward) of this rank's first row whose result counts for
    nothing: under FSDP every rank must run as many forwards as the others, each gathering the
    parameters; its gradient is exactly zero (even for a non-finite log-prob)."""
    row = torch.zeros(1, dtype=torch.long, device=batch.sequences.device)
    with torch.set_grad_enabled(grad):
        with indexer_losses(policy.model, grad and indexer_loss) as layer_losses:
            logp = policy.action_logprobs(
                **_rows(batch, row, kept, routing, None, indexing), temperature=temperature
            )
        if grad:
            nothing = logp.masked_fill(torch.ones_like(logp, dtype=torch.bool), 0.0).sum()
            for v in layer_losses.values():  # the indexer's gradients exist, and are zero, too
                nothing = nothing + v * 0.0
            nothing.backward()


#: Metrics of :func:`grpo_loss` given as a micro-batch's share of the mini-batch's value (summed), and
#: those that are means over the micro-batch's tokens (weighted by its tokens).
_SHARE_METRICS = ("opsm_masked_frac", "kl", "pg_loss", "kl_loss", "log_ratio_sampling")
_TOKEN_METRICS = ("clip_frac", "ratio_mean", "abs_log_ratio")


def _predicting_queries(attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, L - 1]`` whether each query predicts one of its row's tokens (real positions but the
    last): the queries the indexer loss averages over (their count does not depend on the rows' layout)."""
    am = attention_mask.bool()
    return am[:, :-1] & am[:, 1:]


def _emptied(indexing: torch.Tensor | None, predicts: torch.Tensor) -> torch.Tensor | None:
    """The recorded selections ``[layers, B, L - 1, k]`` emptied (−1) at the queries that predict none
    of the row's tokens (``predicts``: :func:`_predicting_queries`) — padding and each row's last
    token: their outputs are never read, and an empty selection leaves them out of the indexer loss
    (Eq. 4 over the replayed set) in every batch layout."""
    if indexing is None:
        return None
    return indexing.masked_fill(~predicts[None, :, : indexing.shape[2], None], -1)


def _rows_of(outputs: torch.Tensor, output_of_row: torch.Tensor, n_outputs: int) -> torch.Tensor:
    """The rows of ``outputs`` (in that order; an output's rows in batch order)."""
    slot = torch.full((n_outputs,), -1, dtype=torch.long, device=output_of_row.device)
    slot[outputs] = torch.arange(len(outputs), device=slot.device)
    rank = slot[output_of_row]  # position of each row's output in ``outputs``; -1: not chosen
    rows = (rank >= 0).nonzero().squeeze(1)
    return rows[torch.sort(rank[rows], stable=True).indices]


@torch.no_grad()
def _log_ratio_rest(
    policy: Policy,
    batch: Rollouts,
    mb,
    ids,
    advantages,
    parts,
    kept,
    routing,
    temperature: float,
    chunk: int,
    trunk=None,
    indexing=None,
) -> list[torch.Tensor]:
    """For each micro-batch ``mb[part]``: per row, Σ log(π_sampling/π_θ) over the action tokens of the
    row's output that lie in the mini-batch's other micro-batches (:class:`OutputTotals`'s
    ``log_ratio_rest``). Nonzero only for outputs with negative advantage whose rows span micro-batches:
    their rows get a no-grad forward under the current π_θ, ``len(parts[0])`` rows at a time."""
    device = mb.device
    output, n = output_index(ids, len(ids), device)  # [R]: each row's output within the mini-batch
    in_part = torch.empty(len(mb), dtype=torch.long, device=device)
    for j, part in enumerate(parts):
        in_part[part] = j
    first = torch.full((n,), len(parts), device=device).scatter_reduce(0, output, in_part, "amin")
    last = torch.zeros(n, dtype=torch.long, device=device).scatter_reduce(0, output, in_part, "amax")
    negative = torch.zeros(n, dtype=torch.bool, device=device).scatter_(0, output, advantages < 0)
    need = ((first != last) & negative)[output]  # [R]
    per_row = torch.zeros(len(mb), device=device)
    chunks = list(need.nonzero().squeeze(1).split(chunk)) if bool(need.any()) else []
    for k in range(int(distributed.all_max([len(chunks)])[0])):  # as many forwards as every rank
        if k >= len(chunks):
            _idle_pass(policy, batch, kept, routing, temperature, grad=False, indexing=indexing)
            continue
        rows = mb[chunks[k]]
        logp = policy.action_logprobs(
            **_rows(batch, rows, kept, routing, trunk, indexing), temperature=temperature
        )
        diff = batch.sampling_logprobs[rows] - logp
        per_row[chunks[k]] = torch.where(batch.action_mask[rows], diff, 0.0).sum(-1).float()
    total = torch.zeros(n, device=device).index_add_(0, output, per_row)
    rests = []
    for part in parts:
        here = torch.zeros(n, device=device).index_add_(0, output[part], per_row[part])
        rests.append((total - here)[output[part]])
    return rests


def _abs_log_ratio(logp: torch.Tensor, old: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean |log π_θ − log π_old| over the action tokens: how far the policy moved (or, on the first,
    on-policy update, how far training and inference disagree)."""
    m = mask.bool()
    return float((logp - old).abs()[m].mean()) if bool(m.any()) else 0.0


def _by_length(batch: Rollouts, idx: torch.Tensor) -> torch.Tensor:
    """Rows ``idx`` shortest first: rows of similar length share a micro-batch, which goes through
    the model trimmed to the columns its rows use (:meth:`Policy.action_logprobs`)."""
    return idx[torch.argsort(batch.attention_mask[idx].sum(1), stable=True)]


def _rows(batch: Rollouts, idx, kept, routing, trunk=None, indexing=None) -> dict:
    rows = batch.rows(idx)
    rows["kept_ids"] = None if kept is None else kept[idx]
    rows["routing"] = None if routing is None else routing[:, idx]
    rows["indexing"] = None if indexing is None else indexing[:, idx]
    if trunk is not None:
        rows["trunk"] = (trunk[0][idx], trunk[1])
    return rows


def _trunk(policy: Policy, batch: Rollouts, chunk: int) -> tuple[torch.Tensor, int] | None:
    """``(states, depth)``: every row's hidden states after the policy's frozen trunk, computed
    ``chunk`` rows at a time (similar lengths together); None when there is none to share, or under
    ``torchrun`` (every rank's forwards gather the sharded layers in step with the others)."""
    if distributed.world().active:
        return None
    depth = policy.frozen_trunk()
    if depth == 0:
        return None
    out = None
    for idx in _by_length(batch, torch.arange(len(batch), device=batch.sequences.device)).split(chunk):
        states = policy.trunk_states(batch.sequences[idx], batch.attention_mask[idx], batch.start, depth)
        out = states.new_empty(len(batch), *states.shape[1:]) if out is None else out
        out[idx] = states
    return out, depth


@torch.no_grad()
def _batch_logprobs(
    policy: Policy, batch: Rollouts, cfg: GRPOConfig, temperature: float, trunk=None
) -> torch.Tensor:
    """``policy``'s action log-probs of every row of ``batch`` (micro-batch by micro-batch), with the
    recorded sampling masks / routing when the config keeps them: the reference policy's, or the
    current policy's recomputed "old" ones; from ``trunk``'s states when given."""
    kept = batch.kept_ids if cfg.keep_sampling_mask else None
    routing = batch.routing if cfg.keep_routing else None
    indexing = batch.indexing if cfg.keep_indexing else None
    idx_all = _by_length(batch, torch.arange(len(batch), device=batch.sequences.device))
    chunks = idx_all.split(cfg.micro_batch)
    n = int(distributed.all_max([len(chunks)])[0])  # as many forwards on every rank, agreed first
    out = []
    for k in range(n):
        if k >= len(chunks):
            _idle_pass(policy, batch, kept, routing, temperature, grad=False, indexing=indexing)
            continue
        idx = chunks[k]
        rows = _rows(batch, idx, kept, routing, trunk, indexing)
        out.append(policy.action_logprobs(**rows, temperature=temperature))
    logp = torch.empty_like(batch.sampling_logprobs, dtype=out[0].dtype)
    logp[idx_all] = torch.cat(out)
    return logp


__all__ = [
    "NonFiniteUpdateError",
    "UpdateGuard",
    "check_finite_policy",
    "check_finite_weights",
    "grpo_update",
    "rl_guard",
]
