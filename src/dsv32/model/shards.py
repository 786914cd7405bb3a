"""The safetensors files of a checkpoint directory.

A checkpoint is shards listed by ``model.safetensors.index.json`` (its ``weight_map``: tensor name →
the name of a shard file in the same directory — a path elsewhere is refused), else
``model.safetensors``, else every ``*.safetensors`` file.
A checkpoint that cannot be read as one raises :class:`CheckpointError`, which names the file and
what is wrong with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
from pathlib import Path

from dsv32.errors import DSV32Error

INDEX_FILE = "model.safetensors.index.json"
_SAVED_NAME = re.compile(r"model(-\d{5}-of-\d{5})?\.safetensors")


class CheckpointError(DSV32Error, ValueError):
    """A checkpoint's files do not hold the tensors its config describes, or are malformed."""


def read_index(path: Path) -> dict[str, str]:
    """The ``weight_map`` of the index file ``path``."""
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path} is not a JSON index file: {err}") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{path} has no weight_map (an object of tensor name → shard file name)")
    for name, shard in weight_map.items():
        if not is_file_name(shard):
            raise CheckpointError(
                f"{path}: {name} is in {shard!r}, which is not a file name inside the checkpoint directory"
            )
    return weight_map


def is_file_name(name: object) -> bool:
    """Whether ``name`` names a file in a directory itself: no folder part, not ``.`` or ``..``."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and "/" not in name
        and "\\" not in name
        and "\0" not in name
    )


def previous_shards(path: Path) -> set[str]:
    """The shard files of the checkpoint now in ``path`` that a new save there replaces: those its
    index names, and ``model.safetensors`` / ``model-NNNNN-of-NNNNN.safetensors`` (the names a save
    writes). Any other file (``model_ema.safetensors``, a tokenizer) is not a shard of it."""
    names = {p.name for p in path.glob("model*.safetensors") if _SAVED_NAME.fullmatch(p.name)}
    index = path / INDEX_FILE
    if index.is_file():
        with contextlib.suppress(CheckpointError):  # unreadable: only the files named like a save's go
            names |= set(read_index(index).values())
    return {name for name in names if (path / name).is_file()}


def temporary_path(path: Path, name: str) -> Path:
    """A fresh hidden file name in ``path`` to write ``name`` under before renaming it into place
    (it does not end in ``.safetensors``, so a load does not take it for a shard)."""
    return path / f".{name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"


def shard_files(path: Path) -> list[Path]:
    """The checkpoint directory's shards, each once, in name order."""
    index = path / INDEX_FILE
    if index.is_file():
        files = [path / name for name in sorted(set(read_index(index).values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index} lists shards that are not in {path}: {', '.join(missing[:4])}")
        return files
    if (path / "model.safetensors").is_file():  # as transformers: other files beside it are not shards
        return [path / "model.safetensors"]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors (nor {INDEX_FILE}) in {path}")
    return files
