"""The distributed mechanics every trainer shares: the process group of a ``torchrun`` launch
(:mod:`.group`), a step's global batch split over the ranks (:mod:`.batch`), FSDP2 sharding and
export of the full model (:mod:`.fsdp`) and DCP step checkpoints (:mod:`.checkpoint`).

One process without ``torchrun`` is the reference: every function here is then a no-op or the
single-process behaviour, and a distributed run computes the same update on the same global batch.
"""

from dsv32.distributed.batch import Share, rank_share, split_evenly
from dsv32.distributed.checkpoint import ShardedCheckpoints
from dsv32.distributed.fsdp import (
    clip_grad_norm,
    copy_full_parameters,
    full_parameters,
    set_gradient_sync,
    shard_model,
)
from dsv32.distributed.group import (
    DistError,
    World,
    all_gather_objects,
    all_max,
    all_sum,
    all_true,
    barrier,
    is_main,
    launched,
    require_one_process,
    setup,
    world,
)

__all__ = [
    "DistError",
    "ShardedCheckpoints",
    "Share",
    "World",
    "all_gather_objects",
    "all_max",
    "all_sum",
    "all_true",
    "barrier",
    "clip_grad_norm",
    "copy_full_parameters",
    "full_parameters",
    "is_main",
    "launched",
    "rank_share",
    "require_one_process",
    "set_gradient_sync",
    "setup",
    "shard_model",
    "split_evenly",
    "world",
]
