"""Step checkpoints of a distributed run, written with ``torch.distributed.checkpoint`` (DCP).

:class:`ShardedCheckpoints` is :class:`dsv32.runlog.StepCheckpoints` — the same folders, run
identity, resume checks, keep count and discard — whose checkpoints, in a distributed run, hold:

- ``dcp/``: the model (or only its trainable parameters) and the optimizer state, each rank writing
  its own shards (a DCP checkpoint: ``.metadata`` and one ``__R_0.distcp`` file per rank);
- ``rng_rankNNNNN.pt``: each rank's RNG states (torch, CUDA, Python, NumPy);
- ``state.json``: the step — which is also the data position, since every trainer derives a step's
  samples from ``(seed, step)`` — the run identity, ``world_size`` and the trainer's own state.

The ranks write these files into a staging folder (:func:`dsv32.runlog.stage_checkpoint`); once
every rank has finished, rank 0 publishes it with :func:`dsv32.runlog.publish_checkpoint`, as every
trainer's checkpoints are published (synced to disk, renamed into place, older ones pruned to
``keep``), so neither a run killed while saving nor a power loss leaves a checkpoint that looks
complete. The world size is not part of the run identity: a checkpoint loads at any world size.
DCP reshards on load (2 processes → 1 → 2 …); a rank with no RNG file of its own (more ranks than
wrote the checkpoint) takes rank 0's. A single-process checkpoint (``weights.safetensors`` +
``optimizer.pt``) loads into a distributed run through the full state dict, and a single process
reads a DCP checkpoint without a process group.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from torch import nn

from dsv32.distributed.group import barrier, world
from dsv32.runlog import (
    CheckpointError,
    StepCheckpoints,
    UnreadableCheckpoint,
    _load_blob,
    fsync_path,
    publish_checkpoint,
    rng_state,
    set_rng_state,
    stage_checkpoint,
    staging_folder,
    step_folder,
)

DCP_DIR = "dcp"


def _rng_file(rank: int) -> str:
    return f"rng_rank{rank:05d}.pt"


def is_dcp(path: Path) -> bool:
    return (Path(path) / DCP_DIR / ".metadata").is_file()


class ShardedCheckpoints(StepCheckpoints):
    """:class:`~dsv32.runlog.StepCheckpoints` that write DCP checkpoints in a distributed run and read
    both kinds at any world size (see the module docstring)."""

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, **state) -> Path:
        w = world()
        if not w.active:
            return super().save(step, model, optimizer, **state)
        import torch.distributed.checkpoint as dcp

        if w.main:
            stage_checkpoint(self.root, step)
        barrier()
        tmp = staging_folder(self.root, step)
        dcp.save(self._state_dicts(model, optimizer), checkpoint_id=tmp / DCP_DIR)  # DCP syncs its files
        torch.save(rng_state(), tmp / _rng_file(w.rank))
        fsync_path(tmp / _rng_file(w.rank))  # by its writer: ranks on other hosts may share the folder
        barrier()
        if w.main:
            state = {"step": step, "run": self.run, "world_size": w.size, **state}
            (tmp / "state.json").write_text(json.dumps(state), encoding="utf-8")
            publish_checkpoint(tmp, step, keep=self.keep)
        barrier()
        return step_folder(self.root, step)

    def load(self, path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
        path = Path(path)
        if is_dcp(path):
            return self._load_dcp(path, model, optimizer)
        if world().active:
            return self._load_full(path, model, optimizer)
        return super().load(path, model, optimizer)

    # ------------------------------------------------------------------ internals
    def _state_dicts(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        weights = get_model_state_dict(model)
        if self.trainable_only:
            trainable = {n for n, p in model.named_parameters() if p.requires_grad}
            weights = {n: t for n, t in weights.items() if n in trainable}
        return {"model": weights, "optimizer": get_optimizer_state_dict(model, optimizer)}

    def _load_dcp(self, path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        step = int(self.state(path)["step"])
        states = self._state_dicts(model, optimizer)
        try:
            with warnings.catch_warnings():  # a single process reading a DCP checkpoint is intended
                warnings.filterwarnings("ignore", message="torch.distributed is disabled")
                dcp.load(states, checkpoint_id=path / DCP_DIR, no_dist=not world().active)
        except Exception as err:  # DCP wraps every rank's failure in one CheckpointException
            why = " ".join(str(err).split())[:300]
            raise CheckpointError(f"{path / DCP_DIR} does not fit this model and optimizer ({why})") from err
        set_model_state_dict(model, states["model"], options=StateDictOptions(strict=not self.trainable_only))
        set_optimizer_state_dict(model, optimizer, states["optimizer"])
        own = path / _rng_file(world().rank)
        rng = own if own.is_file() else path / _rng_file(0)
        try:
            set_rng_state(_load_blob(rng, "cpu"))
        except Exception as err:
            raise UnreadableCheckpoint(f"{rng}: unreadable ({' '.join(str(err).split())[:200]})") from err
        return step

    def _load_full(self, path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
        """A single-process checkpoint into a sharded model: each rank reads the files and keeps its
        shards (the optimizer state's parameter numbers become parameter names)."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        step = int(self.state(path)["step"])
        weights, opt_file = path / "weights.safetensors", path / "optimizer.pt"
        try:
            tensors = load_file(str(weights))
            blob = _load_blob(opt_file, "cpu")
        except (SafetensorError, OSError, ValueError, RuntimeError) as err:
            raise UnreadableCheckpoint(f"{path}: unreadable ({' '.join(str(err).split())[:200]})") from err
        names = {id(p): n for n, p in model.named_parameters()}
        order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
        saved = blob["optimizer"]
        try:
            full_osd = {
                "state": {order[int(i)]: s for i, s in saved["state"].items()},
                "param_groups": [
                    {**g, "params": [order[int(i)] for i in g["params"]]} for g in saved["param_groups"]
                ],
            }
            options = StateDictOptions(full_state_dict=True, strict=False)
            set_model_state_dict(model, tensors, options=options)
            set_optimizer_state_dict(
                model, optimizer, full_osd, options=StateDictOptions(full_state_dict=True)
            )
        except (IndexError, KeyError, ValueError, RuntimeError) as err:
            raise CheckpointError(f"{path} does not fit this model and optimizer ({err})") from err
        set_rng_state(blob["rng"])
        return step
