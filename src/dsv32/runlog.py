"""What a training run leaves on disk, shared by every trainer: ``metrics.jsonl`` (one JSON line per
logged step) and step checkpoints it can resume from exactly.

A checkpoint is ``out_dir/checkpoints/step_NNNNNN/`` with ``weights.safetensors`` (all parameters, or
only the trainable ones), ``optimizer.pt`` (optimizer state and the RNG states of torch, CUDA, Python
and NumPy) and ``state.json`` (the step and whatever the trainer adds). It is written to a temporary
folder and renamed, so a killed run never leaves a half-written checkpoint; the last ``keep`` stay.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from torch import nn

from dsv32.errors import DSV32Error


class CheckpointError(DSV32Error, ValueError):
    """A checkpoint that does not belong to this run (another stage, another model)."""


# ---------------------------------------------------------------------------------------------- metrics
def append_metrics(path: Path, record: dict) -> None:
    with Path(path).open("a") as f:
        f.write(json.dumps(record) + "\n")


def truncate_metrics(path: Path, step: int) -> None:
    """Drop the lines of a ``metrics.jsonl`` after ``step`` (a resumed run rewrites them)."""
    path = Path(path)
    if not path.exists():
        return
    keep = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
    path.write_text("".join(line + "\n" for line in keep))


def read_metrics(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------- checkpoints
def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class StepCheckpoints:
    """``out_dir/checkpoints/step_NNNNNN/`` (see the module docstring). ``trainable_only``: save and
    restore only the parameters with ``requires_grad`` (a frozen base is not copied every time)."""

    def __init__(self, out_dir: str | Path, keep: int = 1, trainable_only: bool = False) -> None:
        self.root = Path(out_dir) / "checkpoints"
        self.keep = max(1, keep)
        self.trainable_only = trainable_only

    def latest(self) -> Path | None:
        done = sorted(p for p in self.root.glob("step_*") if (p / "state.json").is_file())
        return done[-1] if done else None

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, **state) -> Path:
        from safetensors.torch import save_file, save_model

        final, tmp = self.root / f"step_{step:06d}", self.root / f".tmp_step_{step:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        if self.trainable_only:
            tensors = {
                n: p.detach().contiguous().cpu() for n, p in model.named_parameters() if p.requires_grad
            }
            save_file(tensors, str(tmp / "weights.safetensors"))
        else:
            save_model(model, str(tmp / "weights.safetensors"))
        torch.save({"optimizer": optimizer.state_dict(), "rng": rng_state()}, tmp / "optimizer.pt")
        (tmp / "state.json").write_text(json.dumps({"step": step, **state}))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in sorted(self.root.glob("step_*"))[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def state(self, path: Path) -> dict:
        return json.loads((Path(path) / "state.json").read_text())

    def load(self, path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
        """Restore weights, optimizer and RNG states from ``path``; returns its step."""
        from safetensors.torch import load_file, load_model

        path = Path(path)
        device = next(model.parameters()).device
        if self.trainable_only:
            tensors = load_file(str(path / "weights.safetensors"))
            params = dict(model.named_parameters())
            missing = sorted(n for n, p in params.items() if p.requires_grad and n not in tensors)
            if missing or any(n not in params for n in tensors):
                raise CheckpointError(
                    f"{path} does not match the model's trainable parameters (missing {missing[:3]}): "
                    "use another out_dir or start over"
                )
            with torch.no_grad():
                for name, tensor in tensors.items():
                    params[name].copy_(tensor)
        else:
            load_model(model, str(path / "weights.safetensors"), device=str(device))
        blob = torch.load(path / "optimizer.pt", map_location=device, weights_only=False)
        optimizer.load_state_dict(blob["optimizer"])
        set_rng_state(blob["rng"])
        return int(self.state(path)["step"])
