"""FSDP2 (``torch.distributed.fsdp.fully_shard``) for the models dsv32 trains.

:func:`shard_model` shards each lightning indexer, each transformer block and the root, the layout
torchtitan uses; the indexers are units of their own because the trainers call their projections
(registered as FSDP forward methods) outside a block's forward — the warm-up's activation replay —
and because their loss reaches them through detached inputs. Parameters shared by two modules (tied
embeddings) belong to the root unit and stay one parameter. Gradients are summed over the ranks, not
averaged: every trainer normalises its loss by the global count (sequences, tokens) itself, so the
update of ``W`` processes is the update of one.

In a single process (no ``torchrun``) every function here leaves the model as it is.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from dsv32.distributed.group import world

#: Methods of an indexer the trainers call directly (FSDP gathers its parameters around each call).
INDEXER_METHODS = ("project_keys", "project_queries")


def blocks(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks: the entries of the model's first ``layers`` module list."""
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and name.rsplit(".", 1)[-1] == "layers":
            return list(module)
    return []


def shard_model(
    model: nn.Module, *, param_dtype: torch.dtype | None = None, root_methods: Sequence[str] = ()
) -> nn.Module:
    """Shard ``model`` in place over the process group (a no-op in a single process); returns it.
    ``param_dtype``: FSDP's mixed precision (parameters gathered in that dtype, gradients reduced in
    fp32) — for GPU recipes; None keeps the parameters' own dtype. ``root_methods``: methods of the
    model a trainer calls instead of its ``forward`` (FSDP gathers the root's parameters around them)."""
    if not world().active:
        return model
    from torch.distributed.fsdp import (
        FSDPModule,
        MixedPrecisionPolicy,
        fully_shard,
        register_fsdp_forward_method,
    )

    kwargs = {}
    if param_dtype is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for name, module in list(model.named_modules()):
        if name.rsplit(".", 1)[-1] == "indexer" and any(True for _ in module.parameters()):
            fully_shard(module, **kwargs)
            for method in INDEXER_METHODS:
                if callable(getattr(module, method, None)):
                    register_fsdp_forward_method(module, method)
    for block in blocks(model):
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    for method in root_methods:
        register_fsdp_forward_method(model, method)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # plain sums: gloo has no pre-scaled sum
    return model


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def set_gradient_sync(model: nn.Module, on: bool) -> None:
    """Gradient accumulation: ``False`` keeps this micro-batch's gradients local (no reduce-scatter),
    ``True`` (the step's last micro-batch) reduces the accumulated sum."""
    if is_sharded(model):
        model.set_requires_gradient_sync(on)


def local_rows(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """This rank's rows of a tensor sharded on its first dimension and the global index of the first
    one; a plain tensor is all rows from 0."""
    from torch.distributed.tensor import DTensor

    if not isinstance(t, DTensor):
        return t, 0
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    _, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    return t.to_local(), int(offset[0])


def clip_grad_norm(params: Sequence[nn.Parameter], max_norm: float) -> float:
    """``torch.nn.utils.clip_grad_norm_`` over sharded or plain parameters: the global 2-norm of the
    gradients (a sharded norm is completed over the ranks), the gradients scaled to at most
    ``max_norm``; returns the norm before clipping."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, 2.0)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)


@contextmanager
def full_parameters(model: nn.Module) -> Iterator[bool]:
    """Every rank enters; inside, rank 0's ``model`` holds its full parameters as plain CPU tensors
    (tied parameters stay tied), ready for ``save_pretrained``-style export; yields whether this rank
    is the one to write. The sharded parameters are back on exit. A no-op in a single process."""
    w = world()
    if not (w.active and is_sharded(model)):
        yield w.main
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not w.main:
        yield False
        return
    swapped: list[tuple[nn.Module, str, nn.Parameter]] = []
    new: dict[int, nn.Parameter] = {}
    try:
        for prefix, module in model.named_modules():
            for name, param in list(module._parameters.items()):
                if param is None:
                    continue
                fqn = f"{prefix}.{name}" if prefix else name
                if id(param) not in new:
                    new[id(param)] = nn.Parameter(full[fqn], requires_grad=param.requires_grad)
                module._parameters[name] = new[id(param)]
                swapped.append((module, name, param))
        yield True
    finally:
        for module, name, param in swapped:
            module._parameters[name] = param


@torch.no_grad()
def copy_full_parameters(model: nn.Module, replica: nn.Module) -> None:
    """Every rank enters: ``replica``, a plain (unsharded) module of ``model``'s architecture, gets
    ``model``'s full parameters on every rank — for work that must not run through FSDP, such as
    sampling, where the ranks run different numbers of forwards. A plain copy in a single process."""
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    else:
        full = dict(model.named_parameters())
    for name, param in replica.named_parameters():
        param.copy_(full[name])
