"""Supervised fine-tuning on conversations (``dsv32 sft``): the loss only on what the assistant said.

    L(θ) = − Σ_{t ∈ A} log π_θ(x_t | x_<t) / |A|,     A = the assistant tokens of the step's rows

(reasoning, content, DSML tool calls, end tokens; never prompts or tool results — see
:mod:`dsv32.train.sft.data`), averaged over every loss token of the optimizer step, whatever the
micro-batching (as TRL's ``SFTTrainer`` with ``num_items_in_batch``). Models: Hugging Face causal LMs
and native V3.2 checkpoints; tokenizers without the V3.2 special tokens get them, and the
embeddings grow (:mod:`dsv32.train.sft.model`).

The schedule: linear warm-up over ``warmup_steps``, then cosine decay to ``min_lr_ratio`` × ``lr``.
Rows are shuffled per epoch by ``(seed, epoch)``; step ``s`` takes rows ``[s·R, (s+1)·R)`` of that
stream (R = ``batch_size`` × ``grad_accum``), so a run resumed from a checkpoint (weights, optimizer,
RNG states, step) retraces the uninterrupted run bit for bit.

Under ``torchrun`` (:mod:`dsv32.distributed`) the model is sharded with FSDP2 and each rank computes
its part of every step's rows (:func:`dsv32.distributed.rank_share`), divided by the step's global
loss-token count (known to every rank: each reads the whole step's rows' counts); the gradients are
summed over the ranks, so the update is the single-process one. Checkpoints are DCP checkpoints;
rank 0 alone logs, plots and writes the model.

Outputs under ``out_dir``: ``config.json``, ``data.json`` (conversation and token counts),
``metrics.jsonl``, ``sft.png``, ``checkpoints/step_NNNNNN/`` and ``model/`` (weights, tokenizer with
the V3.2 chat template).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dsv32 import distributed
from dsv32.engine.dtype import autocast, mixed_precision
from dsv32.runlog import (
    RUN_OUTPUTS,
    file_digest,
    read_metrics,
    truncate_metrics,
    write_json,
)
from dsv32.trackers import open_trackers, require
from dsv32.train.schedule import warmup_cosine
from dsv32.train.sft.config import SFTConfig, SFTConfigError, SFTTrainConfig
from dsv32.train.sft.data import IGNORE, Example, collate, encode_file, make_rows
from dsv32.train.sft.model import (
    SFTModel,
    check_packing,
    freeze_lower_layers,
    keep_pretrained_rows,
    kept_logits,
    prepare_sft_model,
    save_sft_model,
    shard_sft_model,
    vocab_matrices,
)

__all__ = ["SFTResult", "eval_loss", "loss_sum", "run_identity", "train_sft"]

logger = logging.getLogger(__name__)


@dataclass
class SFTResult:
    out_dir: Path
    steps: int
    seconds: float
    data: dict[str, int]
    metrics: list[dict] = field(default_factory=list)
    model_dir: Path | None = None

    def summary(self) -> str:
        line = f"dsv32 sft: {self.steps} steps in {self.seconds:.0f} s → {self.out_dir}"
        for key, why in (
            ("dropped", "longer than seq_len"),
            ("dropped_no_loss", "no assistant token in seq_len"),
        ):
            if self.data.get(key):
                line += f"; dropped {self.data[key]} of {self.data['examples']} ({why})"
        if self.metrics:
            first, last = self.metrics[0], self.metrics[-1]
            line += f"\nloss {first['loss']:.4f} (step {first['step']}) → {last['loss']:.4f} (step {last['step']})"
            if "eval_loss" in last:
                line += f", eval loss {last['eval_loss']:.4f}"
        return line


def lr_factor(step: int, total: int, cfg: SFTTrainConfig) -> float:
    """Warm-up then cosine to ``min_lr_ratio`` (``step`` from 0)."""
    return warmup_cosine(step, total, cfg.warmup_steps, cfg.min_lr_ratio)


def total_steps(cfg: SFTTrainConfig, rows: int) -> int:
    return cfg.steps or max(1, math.ceil(cfg.epochs * rows / cfg.rows_per_step))


def step_rows(step: int, n_rows: int, cfg: SFTTrainConfig) -> list[int]:
    """Row indices of optimizer step ``step``: an epoch-wise shuffled stream, a function of
    ``(seed, step)`` only."""
    R = cfg.rows_per_step
    perms: dict[int, torch.Tensor] = {}  # one permutation per epoch the step reaches into
    out = []
    for g in range(step * R, (step + 1) * R):
        epoch, within = divmod(g, n_rows)
        if epoch not in perms:
            gen = torch.Generator().manual_seed(cfg.seed * 100_003 + epoch)
            perms[epoch] = torch.randperm(n_rows, generator=gen)
        out.append(int(perms[epoch][within]))
    return out


def loss_sum(
    sm: SFTModel, batch: dict[str, torch.Tensor], packed: bool, precision: torch.dtype | None = None
) -> tuple[torch.Tensor, int]:
    """Σ of −log π over the batch's loss tokens, and their count; ``precision``: the forward's
    autocast dtype (:func:`~dsv32.engine.dtype.mixed_precision`; the loss is fp32 either way)."""
    dev = sm.device
    ids, targets = batch["input_ids"].to(dev), batch["targets"].to(dev)
    positions, segments = batch["position_ids"].to(dev), batch["segments"].to(dev)
    keep = targets != IGNORE
    n = int(keep.sum())
    if packed:
        check_packing(sm)
    with autocast(dev, precision):
        if sm.kind == "native":
            logits = sm.model(ids, attention_mask=(segments >= 0).long(), position_ids=positions).logits[keep]
        else:
            # packed: no mask, so transformers derives the block-diagonal one from the restarting positions
            mask = None if packed else (segments >= 0).long()
            bound = getattr(sm.model, "kept_logits", None)  # the FSDP-wrapped method of a sharded model
            logits = (
                bound(ids, mask, positions, keep)
                if bound
                else kept_logits(sm.model, ids, mask, positions, keep)
            )
    return torch.nn.functional.cross_entropy(logits.float(), targets[keep], reduction="sum"), n


@torch.no_grad()
def eval_loss(
    sm: SFTModel,
    examples: list[Example],
    rows: list[list[int]],
    cfg: SFTConfig,
    precision: torch.dtype | None = None,
) -> float:
    was = sm.model.training
    sm.model.eval()
    total, count = 0.0, 0
    for a in range(0, len(rows), cfg.train.batch_size):
        batch = collate(examples, rows[a : a + cfg.train.batch_size], sm.pad_id)
        s, n = loss_sum(sm, batch, cfg.data.packing, precision)
        total, count = total + float(s), count + n
    sm.model.train(was)
    return total / max(1, count)


def _encode(sm: SFTModel, path: str, cfg: SFTConfig) -> tuple[list[Example], dict[str, int]]:
    d = cfg.data
    return encode_file(
        sm.tokenizer,
        path,
        seq_len=d.seq_len,
        thinking_mode=d.thinking_mode,
        train_on=d.train_on,
        overlong=d.overlong,
    )


#: Fields that do not change what is trained: they may differ when a run is resumed (the number of
#: steps, from ``train.steps`` or ``train.epochs``, may grow; it is checked on its own). The data
#: file is identified by its SHA-256, so the same file under another path resumes.
BOOKKEEPING = {
    "model": ("device",),
    "data": ("path", "eval_path"),
    "train": ("steps", "epochs", "save_every", "log_every", "eval_every", "keep_checkpoints"),
}


def run_identity(cfg: SFTConfig) -> dict:
    """What determines an SFT run, as recipe sections: every field but :data:`BOOKKEEPING`, and the
    SHA-256 of the training data (``data.sha256``)."""
    sections = {name: dict(value) for name, value in cfg.to_dict().items() if name in BOOKKEEPING}
    for name, fields in BOOKKEEPING.items():
        for f in fields:
            sections[name].pop(f)
    sections["data"]["sha256"] = file_digest(cfg.data.path)
    if cfg.lora.enabled:  # off: the identity of a run from before [lora] existed
        sections["lora"] = cfg.to_dict()["lora"]
    return sections


def check_seq_len(cfg: SFTConfig, sm: SFTModel) -> None:
    """``data.seq_len`` must fit the model's position limit (checked before anything is written)."""
    limit = getattr(sm.model.config, "max_position_embeddings", None)
    if limit and cfg.data.seq_len > limit:
        raise SFTConfigError(
            f"data.seq_len = {cfg.data.seq_len} exceeds the model's max_position_embeddings ({limit}); "
            "lower data.seq_len (longer conversations are handled by data.overlong)"
        )


def train_sft(
    cfg: SFTConfig,
    *,
    model: SFTModel | None = None,
    resume: bool = True,
    progress: bool = True,
    stop_after: int | None = None,
    save_model: bool = True,
) -> SFTResult:
    """Run SFT as configured. ``model`` defaults to :func:`prepare_sft_model` of ``cfg.model``;
    ``stop_after`` stops after that step with a checkpoint, as if the run had been killed."""
    from tqdm.auto import tqdm

    from dsv32.train.sft.plot import plot_sft

    tc = cfg.train
    require(cfg.report_to)  # a tracker that is not installed stops the run before the model loads
    w = distributed.setup()
    distributed.rank_share(tc.grad_accum, tc.batch_size, w)  # a step that does not split fails here
    torch.manual_seed(tc.seed)
    sm = model or prepare_sft_model(cfg.model.name, cfg.model.device)
    check_seq_len(cfg, sm)
    if cfg.data.packing:
        check_packing(sm)
    freeze_lower_layers(sm.model, tc.freeze_layers)
    if cfg.lora.enabled:
        _adapt(sm, cfg, w)
    shard_sft_model(sm)
    if tc.new_token_lr > 0 and not sm.added_tokens:
        logger.warning(
            "sft: train.new_token_lr has no effect: the tokenizer already has the V3.2 tokens, so no rows "
            "were added and every embedding row trains at train.lr"
        )
    examples, counts = _encode(sm, cfg.data.path, cfg)
    rows = make_rows(examples, cfg.data.seq_len, cfg.data.packing)
    held = _encode(sm, cfg.data.eval_path, cfg) if cfg.data.eval_path else None
    held_rows = make_rows(held[0], cfg.data.seq_len, cfg.data.packing) if held else []
    total = total_steps(tc, len(rows))
    precision = mixed_precision(sm.model, cfg.model.dtype)  # bf16: autocast over the fp32 weights
    out = Path(cfg.out_dir)
    optimizer = torch.optim.AdamW(_param_groups(sm, tc), lr=tc.lr, betas=tuple(tc.betas))
    ckpts = distributed.ShardedCheckpoints(
        out, keep=tc.keep_checkpoints, trainable_only=cfg.lora.enabled, run=run_identity(cfg)
    )  # LoRA: the adapter and its optimizer state
    metrics_path = out / "metrics.jsonl"
    step = ckpts.begin(sm.model, optimizer, resume=resume, steps=total)
    # only now, every check passed: bad input writes nothing
    data_info = {**counts, "rows": len(rows), "steps": total, "added_tokens": len(sm.added_tokens)}
    if step:
        logger.info("sft: resumed from %s (step %d)", ckpts.resumed_from, step)
    if w.main:
        if step:
            truncate_metrics(metrics_path, step)
        else:
            out.mkdir(parents=True, exist_ok=True)
            ckpts.discard((*RUN_OUTPUTS, "sft.png", "adapter"))
        write_json(out / "config.json", cfg.to_dict())
        write_json(out / "data.json", data_info)
    distributed.barrier()
    last = total if stop_after is None else min(total, stop_after)
    start = time.time()
    bar = tqdm(total=total, initial=step, desc="sft", disable=not (progress and w.main), dynamic_ncols=True)
    sm.model.train()
    trackers = open_trackers(
        cfg.report_to, out, config=cfg.to_dict(), name="sft", main=w.main, resumed_step=step
    )
    try:
        while step < last:
            record = _step(sm, optimizer, examples, rows, cfg, step, total, precision)
            step += 1
            record["seconds"] = round(time.time() - start, 2)
            record["world_size"] = w.size
            if held and ((tc.eval_every and step % tc.eval_every == 0) or step == total):
                record["eval_loss"] = eval_loss(sm, held[0], held_rows, cfg, precision)
            if w.main and (step % tc.log_every == 0 or step == last or "eval_loss" in record):
                trackers.append(metrics_path, record)
            bar.set_postfix(loss=f"{record['loss']:.4f}")
            bar.update(1)
            if (tc.save_every and step % tc.save_every == 0) or step == last:
                ckpts.save(step, sm.model, optimizer)
    finally:
        bar.close()
        trackers.close()
        sm.model.eval()
    distributed.barrier()  # rank 0's metrics.jsonl is complete
    result = SFTResult(out, step, time.time() - start, data_info, read_metrics(metrics_path))
    if w.main:
        plot_sft(metrics_path, out / "sft.png")
    if save_model and step >= total:
        with distributed.full_parameters(sm.model) as writer:  # rank 0 writes the full model
            if writer and cfg.lora.enabled:  # model/ merged, adapter/ in peft's format
                from dsv32.engine.lora import merged_copy, save_adapter

                save_adapter(sm.model, out / "adapter", base=cfg.model.name)
                save_sft_model(dataclasses.replace(sm, model=merged_copy(sm.model)), out / "model")
            elif writer:
                save_sft_model(sm, out / "model")
        distributed.barrier()
        result.model_dir = out / "model"
    return result


def _adapt(sm: SFTModel, cfg: SFTConfig, w: distributed.World) -> None:
    """``[lora]`` on ``sm``'s model (:func:`dsv32.engine.lora.apply_lora`, seeded by ``train.seed``):
    only the adapter trains. Refused under ``torchrun`` and with ``train.new_token_lr`` for added
    tokens (their embedding rows would stay untrained)."""
    from dsv32.engine.lora import apply_lora

    if w.active:
        raise SFTConfigError("[lora] runs in one process: start it without torchrun")
    if new_token_rows(sm, cfg.train):
        raise SFTConfigError(
            "[lora] freezes the embeddings, so the V3.2 tokens this run added would not train: set "
            "train.new_token_lr = 0 or train without [lora]"
        )
    apply_lora(sm.model, cfg.lora, seed=cfg.train.seed)


def new_token_rows(sm: SFTModel, tc: SFTTrainConfig) -> bool:
    """Whether the added tokens' rows train apart (``new_token_lr`` > 0 and this run added tokens)."""
    return tc.new_token_lr > 0 and bool(sm.added_tokens)


def _param_groups(sm: SFTModel, tc: SFTTrainConfig) -> list[dict]:
    """AdamW groups: matrices with weight decay, the rest without; with :func:`new_token_rows` the
    embedding and an untied head alone, only their new rows moving (:func:`keep_pretrained_rows`)."""
    apart = vocab_matrices(sm.model) if new_token_rows(sm, tc) else []
    trainable = [p for p in sm.model.parameters() if p.requires_grad and not any(p is q for q in apart)]
    groups = [
        {"params": [p for p in trainable if p.dim() >= 2], "weight_decay": tc.weight_decay, "base_lr": tc.lr},
        {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0, "base_lr": tc.lr},
    ]
    if apart:
        groups.append(
            {"params": apart, "weight_decay": 0.0, "base_lr": tc.new_token_lr, "lr": tc.new_token_lr}
        )
    return groups


def _step(
    sm: SFTModel,
    optimizer,
    examples,
    rows,
    cfg: SFTConfig,
    step: int,
    total: int,
    precision: torch.dtype | None,
) -> dict:
    tc = cfg.train
    factor = lr_factor(step, total, tc)
    for group in optimizer.param_groups:
        group["lr"] = group["base_lr"] * factor
    picked = [rows[i] for i in step_rows(step, len(rows), tc)]
    n_total = sum(examples[i].loss_tokens for row in picked for i in row)  # over the global batch
    loss_value = 0.0
    shares = distributed.rank_share(tc.grad_accum, tc.batch_size, distributed.world())
    for k, share in enumerate(shares):
        a = share.micro * tc.batch_size
        part = picked[a + share.start : a + share.stop]
        distributed.set_gradient_sync(sm.model, k == len(shares) - 1)  # one reduce per step
        s, _ = loss_sum(sm, collate(examples, part, sm.pad_id), cfg.data.packing, precision)
        (s / n_total).backward()
        loss_value += float(s.detach()) / n_total
    loss_value = distributed.all_sum([loss_value])[0]
    if new_token_rows(sm, tc):
        keep_pretrained_rows(sm.model, sm.base_vocab)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    norm = distributed.clip_grad_norm(params, tc.clip_grad or math.inf)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {
        "step": step + 1,
        "lr": tc.lr * factor,
        "loss": loss_value,
        "loss_tokens": n_total,
        "grad_norm": float(norm),
        "epoch": round((step + 1) * tc.rows_per_step / len(rows), 4),
    }
