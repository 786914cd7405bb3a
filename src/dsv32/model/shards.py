"""The safetensors files of a checkpoint directory.

A checkpoint is shards listed by ``model.safetensors.index.json`` (its ``weight_map``: tensor name →
the name of a shard file in the same directory — a path elsewhere is refused), else
``model.safetensors``, else every ``*.safetensors`` file.
A checkpoint that cannot be read as one raises :class:`CheckpointError`, which names the file and
what is wrong with it.

:class:`SafetensorsFile` reads tensors with plain file reads into memory of their own, not as views
of a memory map of the file: a weight the model keeps then pins no mapping of the whole file for the
model's lifetime (nor crashes the process when the file is rewritten on disk), and a load's peak
memory is the loaded weights plus the tensor being converted, not plus the whole file.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
from pathlib import Path

import torch

from dsv32.errors import DSV32Error

INDEX_FILE = "model.safetensors.index.json"
# safetensors dtype names → torch dtypes (the formats a checkpoint's weights and scales come in).
DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_MAX_HEADER = 100 << 20  # the safetensors format's limit on its JSON header
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


class SafetensorsFile:
    """One safetensors file: its tensor names (:meth:`keys`) and :meth:`read` of a tensor into memory
    of its own. Use as a context manager (it keeps the file open in between)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = None
        size = path.stat().st_size
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little") if size >= 8 else -1
            if not 0 < length <= min(size - 8, _MAX_HEADER):
                raise CheckpointError(f"{path} is not a safetensors file (no valid header length)")
            try:
                header = json.loads(f.read(length))
            except (UnicodeDecodeError, json.JSONDecodeError) as err:
                raise CheckpointError(f"{path} is not a safetensors file (its header: {err})") from None
        if not isinstance(header, dict):
            raise CheckpointError(f"{path} is not a safetensors file (its header is not an object)")
        header.pop("__metadata__", None)
        self._start = 8 + length
        self._entries = {name: self._entry(name, info, size - self._start) for name, info in header.items()}

    def _entry(self, name: str, info: object, data_size: int) -> tuple[torch.dtype, list[int], int, int]:
        """``(dtype, shape, begin, end)`` of the header entry of ``name``, checked against the file."""
        try:
            kind, shape, (begin, end) = info["dtype"], list(info["shape"]), info["data_offsets"]
            ok = all(isinstance(v, int) and v >= 0 for v in (*shape, begin, end))
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise CheckpointError(f"{self.path}: {name} has a malformed header entry {info!r}")
        if kind not in DTYPES:
            raise CheckpointError(f"{self.path}: {name} has dtype {kind!r}, which dsv32 does not read")
        dtype = DTYPES[kind]
        nbytes = dtype.itemsize * torch.Size(shape).numel()
        if end - begin != nbytes or end > data_size:
            raise CheckpointError(
                f"{self.path}: {name} ({kind} {shape}) needs {nbytes} bytes at [{begin}, {end}) "
                f"of {data_size} (a truncated or corrupt file)"
            )
        return dtype, shape, begin, end

    def __enter__(self) -> SafetensorsFile:
        self._file = open(self.path, "rb")
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()
        self._file = None

    def keys(self) -> list[str]:
        return list(self._entries)

    def read(self, name: str) -> torch.Tensor:
        """The tensor ``name``, in a new CPU buffer."""
        dtype, shape, begin, end = self._entries[name]
        data = torch.empty(end - begin, dtype=torch.uint8)
        buffer = memoryview(data.numpy())
        self._file.seek(self._start + begin)
        done = 0
        while done < len(buffer):
            n = self._file.readinto(buffer[done:])
            if not n:
                raise CheckpointError(f"{self.path} ended inside {name} (the file changed while loading)")
            done += n
        return data.view(dtype).reshape(shape)
