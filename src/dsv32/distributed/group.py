"""The process group of a run launched by ``torchrun`` (or any launcher that sets ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``).

:func:`setup` is idempotent and cheap: without those variables (a plain ``dsv32`` command) it does
nothing and the run is one process, the reference every distributed run is checked against. With
them it initializes ``torch.distributed`` — NCCL when CUDA is available (each process on the GPU
``LOCAL_RANK``), gloo on the CPU — with a bounded timeout (``DSV32_DIST_TIMEOUT`` seconds, default
600): a rank that dies makes the others fail at their next collective instead of waiting forever.
Ranks other than 0 log only warnings; progress bars, ``metrics.jsonl`` and plots are rank 0's
(:func:`is_main`).
"""

from __future__ import annotations

import atexit
import logging
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from dsv32.errors import DSV32Error

logger = logging.getLogger(__name__)

TIMEOUT_ENV = "DSV32_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 600.0
_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class DistError(DSV32Error, RuntimeError):
    """A distributed run that cannot go on (a bad launch environment, a recipe that does not split
    over the ranks)."""


@dataclass(frozen=True)
class World:
    """Where this process stands: ``rank`` of ``size`` processes (``size`` 1 and ``active`` False
    for a plain single-process run)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    active: bool = False

    @property
    def main(self) -> bool:
        return self.rank == 0


def launched() -> bool:
    """Whether this process was started by ``torchrun`` (or a launcher setting the same variables)."""
    return all(os.environ.get(v) for v in _LAUNCH_VARS)


def require_one_process(what: str) -> None:
    """:class:`DistError` when this process is one of several launched together: for a trainer that
    runs in one process only (every rank would train alone and write the same files)."""
    size = os.environ.get("WORLD_SIZE", "1") if launched() else "1"
    if size.strip() not in ("", "1"):
        raise DistError(
            f"{what} runs in one process, not under a launch of {size} (torchrun --nproc-per-node / --nnodes): "
            "start it as a plain dsv32 command; the DSA stages, SFT, GRPO (rl train) and agentic GRPO "
            "(posttrain rl) train on several"
        )


def timeout_s() -> float:
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise DistError(f"{TIMEOUT_ENV}={raw!r}: expected a positive number of seconds")
    return value


def setup() -> World:
    """Join the process group of a ``torchrun`` launch (once); a plain run stays one process."""
    if dist.is_available() and dist.is_initialized():
        return world()
    if not launched():
        return World()
    try:
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError as err:
        raise DistError(f"the launcher's RANK/WORLD_SIZE/LOCAL_RANK are not integers ({err})") from None
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group(
        backend="nccl" if cuda else "gloo",
        timeout=timedelta(seconds=timeout_s()),
        device_id=torch.device("cuda", local_rank) if cuda else None,
    )
    atexit.register(_shutdown)
    if rank != 0:
        logging.getLogger().setLevel(logging.WARNING)
    logger.info("distributed: %d processes (%s)", size, dist.get_backend())
    return World(rank, size, local_rank, True)


def _shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def world() -> World:
    """This process's place (a plain run: rank 0 of 1, inactive)."""
    if not (dist.is_available() and dist.is_initialized()):
        return World()
    return World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")), True)


def is_main() -> bool:
    return world().main


def barrier() -> None:
    if world().active:
        dist.barrier()


def _comm_device() -> torch.device:
    return (
        torch.device("cuda", torch.cuda.current_device())
        if dist.get_backend() == "nccl"
        else torch.device("cpu")
    )


def all_sum(values: list[float]) -> list[float]:
    """Element-wise sums over the ranks (float64); the values themselves in a single process."""
    if not world().active or not values:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t)
    return t.cpu().tolist()


def all_true(flag: bool) -> bool:
    """Whether ``flag`` holds on every rank."""
    if not world().active:
        return flag
    t = torch.tensor([0 if flag else 1], dtype=torch.int64, device=_comm_device())
    dist.all_reduce(t)
    return int(t.item()) == 0


def all_max(values: list[float]) -> list[float]:
    """Element-wise maxima over the ranks (float64); the values themselves in a single process."""
    if not world().active or not values:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.cpu().tolist()


def all_gather_objects(obj) -> list:
    """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` in a single process."""
    if not world().active:
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
