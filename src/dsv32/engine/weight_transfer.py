"""Weights from one process to another over a two-party ``torch.distributed`` group: the trainer
(rank 0) broadcasts every tensor of its ``state_dict()``, the inference server (rank 1) receives
them. The same code runs NCCL between GPUs and gloo on CPUs (:func:`backend_for`).

The group is made apart from any default process group (a trainer launched by ``torchrun`` keeps its
own): rank 0 hosts a ``TCPStore`` at ``host:port``, rank 1 connects to it, and each side builds a
``ProcessGroupGloo`` / ``ProcessGroupNCCL`` on that store. Every operation takes a timeout: a peer
that is gone or never joins is a :class:`TransferError` after that many seconds, never a hang.

Before any tensor moves, the receiver checks the sender's list of ``(name, dtype, shape)``
(:func:`tensor_specs`) against its own model (:func:`check_specs`): the same keys — every
``state_dict()`` key, so a tied head is sent with the embedding it shares and is never left stale —
and the same shapes, else nothing is received and the weights stay as they were. Tensors are received
into fresh buffers and copied into the model only once all of them have arrived
(:func:`copy_into`), so a transfer that fails halfway changes nothing either.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist

from dsv32.errors import DSV32Error

BACKENDS = ("gloo", "nccl")


class TransferError(DSV32Error, RuntimeError):
    """The weight transfer group could not be formed, a transfer failed or timed out, or the
    tensors announced do not fit the receiving model (the message says which)."""


def backend_for(device: torch.device | str) -> str:
    """``nccl`` for CUDA tensors, ``gloo`` otherwise."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def _seconds(timeout: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=float(timeout))


def transfer_group(host: str, port: int, rank: int, backend: str, timeout: float):
    """This process's end of the two-party group (``rank`` 0: the sender, which hosts the store)."""
    if backend not in BACKENDS:
        raise TransferError(f"unknown weight transfer backend {backend!r}; known: {list(BACKENDS)}")
    if rank not in (0, 1):
        raise TransferError(f"a weight transfer group has ranks 0 (trainer) and 1 (engine), got {rank}")
    if backend == "nccl" and not torch.cuda.is_available():
        raise TransferError("the nccl weight transfer backend needs CUDA; on CPUs use gloo")
    try:
        store = dist.TCPStore(
            host, port, 2, is_master=rank == 0, timeout=_seconds(timeout), wait_for_workers=False
        )
        if backend == "gloo":
            return dist.ProcessGroupGloo(store, rank, 2, _seconds(timeout))
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = _seconds(timeout)
        return dist.ProcessGroupNCCL(store, rank, 2, options)
    except (RuntimeError, OSError) as err:  # DistStoreError, DistNetworkError are RuntimeErrors
        raise TransferError(
            f"weight transfer group at {host}:{port} ({backend}, rank {rank}): {err} (within {timeout:g} s)"
        ) from None


def tensor_specs(state: Mapping[str, torch.Tensor]) -> dict[str, list]:
    """``{"names", "dtypes", "shapes"}`` of every tensor of ``state`` (a ``state_dict()``), in order."""
    names = list(state)
    return {
        "names": names,
        "dtypes": [str(state[n].dtype).removeprefix("torch.") for n in names],
        "shapes": [list(state[n].shape) for n in names],
    }


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise TransferError(f"unknown dtype {name!r}")
    return dtype


def check_specs(
    model: torch.nn.Module, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]]
) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
    """The announced tensors, checked against ``model``: the same ``state_dict()`` keys and shapes
    (dtypes may differ: the received values are cast), else a :class:`TransferError` naming the
    first difference."""
    if not len(names) == len(dtypes) == len(shapes):
        raise TransferError(
            f"{len(names)} names, {len(dtypes)} dtypes and {len(shapes)} shapes: one per tensor"
        )
    own = model.state_dict()
    missing = [n for n in own if n not in set(names)]
    extra = [n for n in names if n not in own]
    if missing or extra or len(set(names)) != len(names):
        raise TransferError(
            f"the tensors announced are not the model's state_dict(): missing {missing[:5]}, unknown "
            f"{extra[:5]}{', duplicated names' if len(set(names)) != len(names) else ''}"
        )
    out = []
    for name, dtype, shape in zip(names, dtypes, shapes):
        if tuple(shape) != tuple(own[name].shape):
            raise TransferError(
                f"{name}: shape {list(shape)} announced, the model's is {list(own[name].shape)}"
            )
        out.append((name, _dtype(dtype), tuple(shape)))
    return out


def send(group, state: Mapping[str, torch.Tensor], timeout: float) -> None:
    """Broadcast every tensor of ``state`` (rank 0), in order, each within ``timeout`` seconds."""
    for name, tensor in state.items():
        t = tensor.detach().contiguous()
        try:
            group.broadcast(t, 0, _seconds(timeout)).wait()
        except RuntimeError as err:
            raise TransferError(f"sending {name}: {err}") from None


def receive(
    group, specs: Sequence[tuple[str, torch.dtype, tuple[int, ...]]], device, timeout: float
) -> dict[str, torch.Tensor]:
    """Receive the tensors ``specs`` announced (rank 1) into fresh buffers on ``device``."""
    out = {}
    for name, dtype, shape in specs:
        t = torch.empty(shape, dtype=dtype, device=device)
        try:
            group.broadcast(t, 0, _seconds(timeout)).wait()
        except RuntimeError as err:
            raise TransferError(f"receiving {name}: {err}") from None
        out[name] = t
    return out


@torch.no_grad()
def copy_into(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    """Copy received tensors into ``model``'s parameters and buffers (cast to their dtypes)."""
    own = model.state_dict()
    for name, t in tensors.items():
        own[name].copy_(t)
