"""The two stages of DSA continued pre-training (paper §2.1.1) as one loop.

- ``warmup``: dense attention; every parameter frozen but the indexers, which minimize Eq. 3.
- ``sparse``: top-k selection on; the model minimizes the LM loss, the indexers Eq. 4 over their
  selection. The indexers read detached inputs, so one backward of ``LM + Σ_layers L_I`` gives each
  side only its own gradient; the two sides are separate AdamW parameter groups, clipped separately.

Determinism and exact resume: the sequences of step s (and the indexer loss's query subsample) are a
function of ``(seed, s)`` only; a checkpoint holds the trainable parameters, the optimizer state and
the step; the learning rate is recomputed from the step. A resumed run therefore retraces the same
loss curve (tests/train check it bit for bit on CPU).

Non-finite updates (:mod:`dsv32.training_guard`): a step whose loss or gradient norm is NaN/inf is
skipped — no optimizer step, so the weights and AdamW's moments stay as they were — and counted as
``skipped_updates``; ``max_skipped_updates`` such steps in a row stop the stage with
``NonFiniteUpdateError`` (the streak is saved with each checkpoint), and no checkpoint or model is
written from non-finite weights.

Distributed (under ``torchrun``, :mod:`dsv32.distributed`): the model is sharded with FSDP2, each rank
reads its part of every step's sequences (:func:`dsv32.distributed.rank_share`), the losses are scaled by
the global sequence count and the gradients summed over the ranks — the same update as one process
on the same global batch; checkpoints are DCP checkpoints; rank 0 alone logs, plots and writes the
model (gathered from the shards).

Outputs under ``out_dir``: ``metrics.jsonl`` (one line per logged step), ``loss.png``,
``checkpoints/step_NNNNNN/``, and ``model/`` (the trained model, reloadable with
:func:`dsv32.train.load_dsa_model`).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from dsv32 import distributed
from dsv32.dsa.hf import LayerView, get_dsa
from dsv32.runlog import (
    RUN_OUTPUTS,
    CheckpointError,
    OtherRunCheckpoint,
    truncate_metrics,
    write_json,
)
from dsv32.trackers import open_trackers, require
from dsv32.train.dsa.config import StageConfig, TrainConfigError
from dsv32.train.dsa.data import TokenData, sequence_order
from dsv32.train.dsa.models import DSAModel
from dsv32.train.schedule import warmup_cosine
from dsv32.training_guard import UpdateGuard, check_finite_weights

logger = logging.getLogger(__name__)


@dataclass
class StageResult:
    stage: str
    out_dir: Path
    steps: int
    seconds: float
    metrics: list[dict] = field(default_factory=list)
    model_dir: Path | None = None


def lr_factor(step: int, cfg: StageConfig) -> float:
    """Linear warm-up over ``warmup_steps`` then cosine decay to ``min_lr_ratio`` at the last step
    (``step`` counts from 0)."""
    return warmup_cosine(step, cfg.steps, cfg.warmup_steps, cfg.min_lr_ratio)


def _param_groups(dm: DSAModel, cfg: StageConfig) -> list[dict]:
    """AdamW groups: the indexer (and, in the sparse stage, the model), weight decay only on matrices."""
    sides = [("indexer", dm.indexer_named_parameters(), cfg.indexer_lr or cfg.lr)]
    if cfg.stage == "sparse":
        sides.insert(0, ("model", dm.model_named_parameters(), cfg.lr))
    groups = []
    for side, named, lr in sides:
        for decay in (True, False):
            params = [p for _, p in named if (p.dim() >= 2) == decay]
            if params:
                wd = cfg.weight_decay if decay else 0.0
                groups.append({"params": params, "lr": lr, "base_lr": lr, "weight_decay": wd, "side": side})
    return groups


def _set_trainable(dm: DSAModel, cfg: StageConfig) -> None:
    indexer = {id(p) for _, p in dm.indexer_named_parameters()}
    for p in dm.model.parameters():
        p.requires_grad_(cfg.stage == "sparse" or id(p) in indexer)


class _Replay:
    """Warm-up activation replay: the frozen model's per-layer inputs of a pool of sequences, captured
    once (dense forward, no gradients) and reused for ``replay`` passes. The indexer loss computed
    from them is exactly the online one — the model is frozen and the indexers' inputs are detached."""

    def __init__(self, dm: DSAModel, data: torch.Tensor, cfg: StageConfig) -> None:
        if dm.kind != "hf":
            raise TrainConfigError(
                "warmup.replay > 1 needs a Hugging Face model (the native model has no observer)"
            )
        if cfg.replay_pool % cfg.batch_size:
            raise TrainConfigError(
                f"replay_pool={cfg.replay_pool} must be a multiple of batch_size={cfg.batch_size}"
            )
        self.dm, self.data, self.cfg = dm, data, cfg
        self.pool_id: int | None = None
        self.views: dict[int, list[LayerView]] = {}

    def sequence_at(self, g: int) -> tuple[int, int]:
        """Global sample index → (pool id, sequence id)."""
        P, R = self.cfg.replay_pool, self.cfg.replay
        pool, within = divmod(g, P * R)
        epoch, j = divmod(within, P)
        perm = torch.randperm(
            P, generator=torch.Generator().manual_seed(self.cfg.seed * 7919 + pool * 131 + epoch)
        )
        stream_pos = pool * P + int(perm[j])
        return pool, sequence_order(self.data.shape[0], self.cfg.seed, stream_pos, 1)[0]

    def views_for(self, g: int) -> list[LayerView]:
        pool, seq = self.sequence_at(g)
        if pool != self.pool_id:
            self._capture(pool)
        return self.views[seq]

    def _capture(self, pool: int) -> None:
        P = self.cfg.replay_pool
        seqs = sequence_order(self.data.shape[0], self.cfg.seed, pool * P, P)
        self.views, self.pool_id = {}, pool
        handle = get_dsa(self.dm.model)
        for a in range(0, P, self.cfg.batch_size):
            batch = seqs[a : a + self.cfg.batch_size]
            captured: list[LayerView] = []
            with handle.observing(captured.append), torch.no_grad():
                self.dm.logits(self.data[batch].to(self.dm.device), logits_to_keep=1)
            for b, seq in enumerate(batch):
                self.views[seq] = [_row(view, b) for view in captured]


def _row(view: LayerView, b: int) -> LayerView:
    """Batch row ``b`` of a captured view."""
    pick = slice(b, b + 1)
    return LayerView(
        layer_idx=view.layer_idx,
        indexer=view.indexer,
        hidden=view.hidden[pick],
        cos=view.cos[pick] if view.cos.shape[0] > 1 else view.cos,
        sin=view.sin[pick] if view.sin.shape[0] > 1 else view.sin,
        q=view.q[pick],
        k=view.k[pick],
        scale=view.scale,
        topk_indices=None if view.topk_indices is None else view.topk_indices[pick],
        key_padding_mask=None if view.key_padding_mask is None else view.key_padding_mask[pick],
    )


def _query_rows(cfg: StageConfig, step: int, micro: int, T: int, device) -> torch.Tensor | None:
    if cfg.loss_queries is None or cfg.loss_queries >= T:
        return None
    g = torch.Generator().manual_seed(cfg.seed * 1_000_033 + step * 4099 + micro)
    return torch.randperm(T, generator=g)[: cfg.loss_queries].sort().values.to(device)


#: Stage fields that do not change what is trained: they may differ when a run is resumed. ``steps`` is
#: not one of them: the cosine schedule decays over it and the data packs ``steps × sequences`` per
#: step, so a run continues only with the steps it started with.
BOOKKEEPING = ("save_every", "keep_checkpoints", "log_every", "max_skipped_updates")


def stage_identity(cfg: StageConfig) -> dict:
    """The fields of a stage config that determine its training (all but :data:`BOOKKEEPING`)."""
    return {k: v for k, v in asdict(cfg).items() if k not in BOOKKEEPING}


def train_stage(
    dm: DSAModel,
    data: TokenData,
    cfg: StageConfig,
    out_dir: str | Path,
    *,
    resume: bool = True,
    progress: bool = True,
    stop_after: int | None = None,
    save_model: bool = True,
    run: dict | None = None,
    report_to: str = "none",
    config: dict | None = None,
) -> StageResult:
    """Run one stage (``cfg.stage``) on ``dm`` in place. ``resume``: continue from the latest
    checkpoint in ``out_dir`` if it belongs to this run, else start over (discarding the previous
    run there); ``stop_after``: stop (with a checkpoint) after that step, as if the run were
    interrupted; ``save_model``: write ``out_dir/model`` at the end; ``run``: what else determines
    the run (model, DSA and data settings as recipe sections; default: the model's and the data's
    names), compared with a checkpoint's before resuming from it (:mod:`dsv32.runlog`);
    ``report_to``: experiment trackers that mirror ``metrics.jsonl`` (:mod:`dsv32.trackers`), with
    ``config`` (default: the stage's settings) logged once. Nothing is written before every check
    has passed."""
    from tqdm.auto import tqdm

    from dsv32.train.dsa.plot import plot_metrics

    out = Path(out_dir)
    require(report_to)
    w = distributed.setup()
    shares = distributed.rank_share(cfg.grad_accum, cfg.batch_size, w)
    if cfg.stage == "warmup":
        dm.set_mode("dense")
    else:
        dm.set_mode("sparse", cfg.index_topk)
    if distributed.fsdp.is_sharded(dm.model):  # FSDP fixed its trainable set when it first gathered
        raise distributed.DistError(
            "a model sharded by an earlier stage cannot train another stage in the same processes: "
            "run each stage as its own torchrun launch (dsv32 dsa warmup, then dsv32 dsa sparse)"
        )
    _set_trainable(dm, cfg)
    if w.active:
        gpu_bf16 = dm.device.type == "cuda" and dm.autocast_dtype == torch.bfloat16
        distributed.shard_model(dm.model, param_dtype=torch.bfloat16 if gpu_bf16 else None)
    groups = _param_groups(dm, cfg)
    if not groups:
        raise TrainConfigError("nothing to train: the model has no indexer parameters")
    seqs = data.train_sequences(cfg.seq_len)
    if seqs.shape[0] == 0:
        raise TrainConfigError(
            f"{cfg.stage}.seq_len = {cfg.seq_len}: the training text has {data.train_stream.numel()} tokens, "
            "not one sequence of that length"
        )
    replay = _Replay(dm, seqs, cfg) if cfg.stage == "warmup" and cfg.replay > 1 else None
    optimizer = torch.optim.AdamW(groups, betas=tuple(cfg.betas), eps=1e-8)
    identity = dict(
        run or {"model": {"name": dm.source}, "data": {"source": data.source, "seq_len": data.seq_len}}
    )
    identity |= {"stage": cfg.stage, cfg.stage: stage_identity(cfg)}
    ckpts = distributed.ShardedCheckpoints(out, cfg.keep_checkpoints, trainable_only=True, run=identity)
    metrics_path = out / "metrics.jsonl"
    try:
        step = ckpts.begin(dm.model, optimizer, resume=resume, steps=cfg.steps)
    except OtherRunCheckpoint as err:
        _refuse_other_steps(err, cfg)
        raise
    guard = UpdateGuard(cfg.max_skipped_updates, advice=_advice(cfg))
    if step:
        logger.info("%s: resumed from %s (step %d)", cfg.stage, ckpts.resumed_from, step)
        guard.restore(ckpts.state(ckpts.resumed_from))
        if w.main:
            truncate_metrics(metrics_path, step)
    elif w.main:
        out.mkdir(parents=True, exist_ok=True)
        ckpts.discard((*RUN_OUTPUTS, "loss.png"))
    if w.main:
        write_json(out / "stage.json", {"model": dm.source, **asdict(cfg)})
    distributed.barrier()

    T = seqs.shape[1]
    last = min(cfg.steps, stop_after) if stop_after is not None else cfg.steps
    records: list[dict] = []
    dm.model.train()
    start = time.time()
    bar = tqdm(
        total=cfg.steps,
        initial=step,
        desc=f"dsa {cfg.stage}",
        disable=not (progress and w.main),
        dynamic_ncols=True,
    )
    config = config or {"model": dm.source, cfg.stage: asdict(cfg)}
    trackers = open_trackers(
        report_to, out, config=config, name=f"dsa-{cfg.stage}", main=w.main, resumed_step=step
    )
    try:
        while step < last:
            factor = lr_factor(step, cfg)
            for group in optimizer.param_groups:
                group["lr"] = group["base_lr"] * factor
            layer_sums: dict[int, float] = {}
            lm_sum = 0.0
            for n, share in enumerate(shares):
                # this rank's rows of micro-batch share.micro, as a fraction of a whole micro-batch
                g0 = (step * cfg.grad_accum + share.micro) * cfg.batch_size + share.start
                weight = share.rows / cfg.batch_size
                rows = _query_rows(cfg, step, share.micro, T, dm.device)
                last_share = n == len(shares) - 1
                if replay is not None:
                    layer_losses = _replay_micro(replay, g0, share.rows, cfg, rows, last_share)
                    lm, weight = None, 1.0  # per-sequence losses: already parts of the micro-batch
                else:
                    # gradients are reduced over the ranks once per step, with its last micro-batch
                    distributed.set_gradient_sync(dm.model, last_share)
                    ids = seqs[sequence_order(seqs.shape[0], cfg.seed, g0, share.rows)].to(dm.device)
                    layer_losses, lm = _online_micro(dm, ids, cfg, rows, weight)
                for i, v in layer_losses.items():
                    layer_sums[i] = layer_sums.get(i, 0.0) + v * weight / cfg.grad_accum
                if lm is not None:
                    lm_sum += lm * weight / cfg.grad_accum
            if w.active:  # the step's losses over the global batch
                keys = sorted(layer_sums)
                summed = distributed.all_sum([layer_sums[i] for i in keys] + [lm_sum])
                layer_sums, lm_sum = dict(zip(keys, summed[:-1])), summed[-1]
            norms = {}
            for side in ("model", "indexer"):
                params = [p for g in optimizer.param_groups if g["side"] == side for p in g["params"]]
                if params:
                    norms[side] = distributed.clip_grad_norm(params, cfg.clip_grad or float("inf"))
            finite = all(math.isfinite(v) for v in (*layer_sums.values(), lm_sum, *norms.values()))
            bad_norm = next((v for v in norms.values() if not math.isfinite(v)), max(norms.values()))
            applied = guard.allows(finite, bad_norm)
            if applied:  # a NaN/inf step would poison the weights and AdamW's moments for good
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            lrs = {g["side"]: g["lr"] for g in optimizer.param_groups}
            record = {
                "step": step,
                "lr": lrs.get("model", lrs["indexer"]),  # the model's in the sparse stage
                "loss_indexer": sum(layer_sums.values()) / max(1, len(layer_sums)),
                "grad_norm_indexer": norms.get("indexer"),
                "tokens": step * cfg.sequences_per_step * T,
                "skipped_updates": 0 if applied else 1,
                "seconds": round(time.time() - start, 2),
                "world_size": w.size,
            }
            if cfg.stage == "sparse":
                record["lr_indexer"] = lrs["indexer"]
                record["loss_lm"] = lm_sum
                record["grad_norm_model"] = norms.get("model")
            if step % cfg.log_every == 0 or step == last or not applied:
                record["layer_loss"] = [round(layer_sums[i], 5) for i in sorted(layer_sums)]
                if w.main:
                    trackers.append(metrics_path, record)
            records.append(record)
            postfix = {"L_I": f"{record['loss_indexer']:.4f}"}
            if "loss_lm" in record:
                postfix["LM"] = f"{record['loss_lm']:.4f}"
            bar.set_postfix(postfix)
            bar.update(1)
            if (cfg.save_every and step % cfg.save_every == 0) or step == last:
                check_finite_weights(dm.model, step, advice=_advice(cfg, weights=True))
                ckpts.save(step, dm.model, optimizer, stage=cfg.stage, skipped_streak=guard.streak)
    finally:
        bar.close()
        trackers.close()
        _restore(dm)
    result = StageResult(cfg.stage, out, step, time.time() - start, records)
    if w.main:
        plot_metrics(metrics_path, out / "loss.png", title=f"DSA {cfg.stage}")
    if save_model and step >= cfg.steps:
        weights = cfg.stage == "sparse" or dm.kind == "native"
        with distributed.full_parameters(dm.model) as writer:  # rank 0 writes the full model
            if writer:
                dm.save(out / "model", weights=weights)
        distributed.barrier()
        result.model_dir = out / "model"
    return result


def _refuse_other_steps(err: OtherRunCheckpoint, cfg: StageConfig) -> None:
    """Say why, when a checkpoint of another run differs from this one only in ``steps``."""
    saved = err.saved.get(cfg.stage)
    before = saved.get("steps") if isinstance(saved, dict) else None
    if isinstance(before, int) and err.differences == [f"{cfg.stage}.steps {before} → {cfg.steps}"]:
        raise CheckpointError(
            f"{err.path} belongs to a {before}-step {cfg.stage} stage, not {cfg.steps}: the number of steps "
            "sets the learning-rate schedule and the sequences the stage reads, so a run continues only "
            f"with the steps it started with (--steps {before}); to train for {cfg.steps}, start over "
            "with --no-resume (this discards that run) or choose another --out"
        ) from None


def _advice(cfg: StageConfig, weights: bool = False) -> str:
    """What to change when a stage's updates (or, ``weights``, its weights) are not finite."""
    s = cfg.stage
    if weights:
        return f"resume from the last checkpoint with a lower {s}.lr or a tighter {s}.clip_grad"
    lrs = f"{s}.lr" + (f" (and {s}.indexer_lr)" if s == "sparse" else "")
    return f"lower {lrs}, set {s}.clip_grad, or check model.dtype and the data"


def _restore(dm: DSAModel) -> None:
    """The model as a stage found it: eval mode, every parameter trainable, no loss collection."""
    dm.model.eval()
    for p in dm.model.parameters():
        p.requires_grad_(True)
    dm.collect_losses(False)


def _online_micro(
    dm: DSAModel, ids: torch.Tensor, cfg: StageConfig, rows, weight: float = 1.0
) -> tuple[dict[int, float], float | None]:
    """One micro-batch (``weight``: its share of a whole one) with the losses computed inside the
    forward; backward of (LM +) Σ L_I."""
    dm.collect_losses(True, rows)
    try:
        if cfg.stage == "warmup":
            dm.logits(ids, logits_to_keep=1)  # the LM head is not needed: only the indexer learns
            lm = None
        else:
            nll, n = dm.lm_loss_sum(ids)
            lm = nll / n
        losses = dm.pop_losses()
    finally:
        dm.collect_losses(False)
    if not losses:
        raise TrainConfigError("the forward produced no indexer loss (no DSA layer?)")
    total = sum(losses.values())
    if lm is not None:
        total = total + lm
    (total * weight / cfg.grad_accum).backward()
    return {i: float(v.detach()) for i, v in losses.items()}, None if lm is None else float(lm.detach())


def _replay_micro(
    replay: _Replay, g0: int, count: int, cfg: StageConfig, rows, last_share: bool
) -> dict[int, float]:
    """``count`` sequences of a micro-batch from cached activations: per sequence and layer, backward
    of L_I at once (each sequence's loss is already a ``1 / batch_size`` part of the micro-batch's)."""
    sums: dict[int, float] = {}
    for b in range(count):
        views = replay.views_for(g0 + b)
        for v, view in enumerate(views):
            # gradients are reduced over the ranks once per step, with the step's last backward
            distributed.set_gradient_sync(
                replay.dm.model, last_share and b == count - 1 and v == len(views) - 1
            )
            loss = view.indexer_loss(query_rows=rows) / cfg.batch_size
            (loss / cfg.grad_accum).backward()
            sums[view.layer_idx] = sums.get(view.layer_idx, 0.0) + float(loss.detach())
    return sums
