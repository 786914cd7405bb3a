"""Trainer → engine weight sync.

The ``file`` backend writes version-stamped safetensors of the whole ``state_dict()``
(:mod:`dsv32.engine.weight_files`: every key, tied head included, written atomically) into a
directory the engine can read, and keeps only the newest. The ``nccl`` backend (a GPU-to-GPU
broadcast into the engine's workers) is not part of this build: asking for it is an
:class:`~dsv32.rl.engines.base.EngineError` that says so.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from dsv32.engine.weight_files import save_weights, weights_file
from dsv32.rl.engines.base import EngineError


class FileWeightSync:
    """Writes version-stamped weight files under ``directory`` and keeps only the newest
    ``keep`` of them."""

    def __init__(self, directory: str | Path, keep: int = 1) -> None:
        self.directory = Path(directory)
        self.keep = keep

    def write(self, model: torch.nn.Module, version: int) -> tuple[Path, float]:
        t = time.perf_counter()
        path = save_weights(model, weights_file(self.directory, version), version)
        return path, time.perf_counter() - t

    def prune(self) -> None:
        files = sorted(self.directory.glob("weights-v*.safetensors"))
        for old in files[: max(0, len(files) - self.keep)]:
            old.unlink(missing_ok=True)


def weight_sync(kind: str, directory: str | Path) -> FileWeightSync:
    """The backend of ``[engine] sync``."""
    if kind == "file":
        return FileWeightSync(directory)
    if kind == "nccl":
        raise EngineError(
            "[engine] sync = 'nccl' is not available in this build: weights reach a remote engine by "
            "file (sync = 'file', a directory the engine can read); see docs/rl.md, 'Scaling out'"
        )
    raise EngineError(f"unknown weight sync {kind!r}; known: 'file', 'nccl'")
