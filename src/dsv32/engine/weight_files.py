"""Weight files for trainer → engine transfer: the model's *whole* ``state_dict()`` in one
safetensors file stamped with a weight version.

Every key is written, so a tied LM head travels with the embedding it shares storage with and cannot
be left stale; the file is written under a temporary name and renamed into place, so a reader never
sees half a file. :func:`load_weights` refuses a file whose keys or shapes differ from the model's
(no silent partial update) and returns the version it carries. A refusal names the file and what is
wrong with it, never text read from it (a server that loads a path a client names must not become a
way to read files: the safetensors parser's own messages quote the header, so they are not passed on).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from dsv32.errors import DSV32Error


class WeightFileError(DSV32Error, ValueError):
    """A weight file that cannot be read, or does not fit the model it is loaded into."""


VERSION_KEY = "dsv32_weight_version"


def weights_file(directory: str | Path, version: int) -> Path:
    return Path(directory) / f"weights-v{version:06d}.safetensors"


def save_weights(model: torch.nn.Module, path: str | Path, version: int) -> Path:
    """Write every ``state_dict()`` entry of ``model`` to ``path`` (atomically), stamped ``version``.
    Tensors that share storage (a tied head) are written as separate copies under each key."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in model.state_dict().items()}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file(tensors, str(tmp), metadata={VERSION_KEY: str(int(version))})
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _unreadable(path: str | Path, err: Exception) -> WeightFileError:
    """The error for a file that cannot be read as safetensors, without the parser's message (which
    quotes the file's header)."""
    if isinstance(err, OSError) and err.strerror:
        why = err.strerror
    else:
        why = "not a safetensors file, or one cut short"
    return WeightFileError(f"cannot read weights file {path}: {why}")


def file_version(path: str | Path) -> int:
    """The weight version stamped in a file written by :func:`save_weights`."""
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except (OSError, ValueError, RuntimeError, SafetensorError) as err:  # missing, truncated, not safetensors
        raise _unreadable(path, err) from err
    if VERSION_KEY not in meta:
        raise WeightFileError(f"{path} carries no {VERSION_KEY} metadata: not a dsv32 weight-sync file")
    try:
        return int(meta[VERSION_KEY])
    except ValueError:
        raise WeightFileError(f"{path}: its {VERSION_KEY} metadata is not an integer") from None


@torch.no_grad()
def load_weights(model: torch.nn.Module, path: str | Path) -> int:
    """Load a :func:`save_weights` file into ``model`` (on its device and dtypes); returns its version.
    Every key of the model must be in the file with its shape, and nothing else."""
    version = file_version(path)
    try:
        tensors = load_file(str(path))
    except (OSError, ValueError, RuntimeError, SafetensorError) as err:  # e.g. cut short after its header
        raise _unreadable(path, err) from err
    own = model.state_dict()
    missing, extra = sorted(set(own) - set(tensors)), set(tensors) - set(own)
    if missing or extra:  # the model's names only: the file's own are text read from it
        raise WeightFileError(
            f"weights file {path} does not match the served model: missing {missing[:5]} "
            f"({len(missing)} missing), and {len(extra)} key(s) the model does not have"
        )
    wrong = [k for k, v in tensors.items() if v.shape != own[k].shape]
    if wrong:
        k = wrong[0]
        raise WeightFileError(
            f"weights file {path}: {k} has shape {list(tensors[k].shape)}, the model's is {list(own[k].shape)}"
        )
    for k, v in tensors.items():  # copy_ into each entry: a tied head gets the same values twice
        own[k].copy_(v.to(own[k].device, own[k].dtype))
    return version
