"""The dtype a model runs in: ``float32``, ``bfloat16``, or ``auto`` (bfloat16 where the device has
fast bf16 arithmetic, else float32).

In bfloat16 the weights, activations and KV cache are bf16; matmuls take bf16 inputs and accumulate
in fp32 (PyTorch's CPU GEMM through oneDNN, cuBLAS on GPUs), rounding only their output to bf16.
Norms and softmax follow the model's own code (transformers' RMSNorm and the native model upcast to
fp32). The logits leave the model in bf16; everything the sampler derives from them — log-probs,
top-k/top-p and the kept sets — is computed after an upcast to fp32 (:mod:`dsv32.engine.sampling`).

Fast bf16 is native bf16 arithmetic: on a CPU the AVX512-BF16 or AMX instructions (without them
PyTorch emulates bf16 and a matmul is many times slower than in fp32), on CUDA a GPU whose
``torch.cuda.is_bf16_supported()`` says so. ``auto`` falls back to fp32 with a one-line message
where bf16 is not fast; an explicit ``bfloat16`` there runs, with a warning.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
from pathlib import Path

import torch

from dsv32.errors import DSV32Error

logger = logging.getLogger(__name__)

DTYPES = ("auto", "float32", "bfloat16")
_TORCH = {"float32": torch.float32, "bfloat16": torch.bfloat16}
#: the /proc/cpuinfo flags of native bf16 arithmetic
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


class DtypeError(DSV32Error, ValueError):
    """A dtype name that is not one of :data:`DTYPES`."""


def check_dtype(name: object, what: str = "dtype") -> str:
    """``name`` when it is one of :data:`DTYPES`, else a :class:`DtypeError` saying what to pass."""
    if name not in DTYPES:
        raise DtypeError(f"{what} {name!r} is not one of {', '.join(DTYPES)}")
    return str(name)


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` → ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def _cpuinfo_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


@functools.cache
def cpu_has_fast_bf16() -> bool:
    """Whether this CPU computes in bf16 natively (AVX512-BF16 or AMX), by PyTorch's own CPU check
    where it has one, else by the ``/proc/cpuinfo`` flags (cached: asked once per process)."""
    checks = [getattr(torch.cpu, n, None) for n in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    if all(callable(c) for c in checks):
        return any(bool(c()) for c in checks)
    return bool(_cpuinfo_flags() & set(BF16_FLAGS))


def fast_bf16(device: torch.device | str = "cpu") -> bool:
    """Whether ``device`` computes in bf16 natively (see the module docstring)."""
    device = torch.device(device)
    if device.type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if device.type == "cpu":
        return cpu_has_fast_bf16()
    return False


def describe_bf16(device: torch.device | str = "cpu") -> str:
    """``device`` and whether its bf16 is native, in words (logs, benchmark JSON)."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        where = torch.cuda.get_device_name(device)
    else:
        where = f"CPU {torch.backends.cpu.get_cpu_capability()}"
        flags = _cpuinfo_flags() & set(BF16_FLAGS)
        where += f" ({', '.join(sorted(flags))})" if flags else ""
    return f"{where}: {'native' if fast_bf16(device) else 'no native'} bf16"


def resolve_dtype(name: str | torch.dtype, device: torch.device | str = "cpu") -> torch.dtype:
    """The torch dtype of ``name`` on ``device``: ``auto`` is bfloat16 where :func:`fast_bf16`, else
    float32 (with a one-line message); ``bfloat16`` where bf16 is not fast warns. A torch dtype is
    returned as it is."""
    if isinstance(name, torch.dtype):
        return name
    check_dtype(name)
    if name == "auto":
        if fast_bf16(device):
            return torch.bfloat16
        logger.info("dtype auto: float32 (%s)", describe_bf16(device))
        return torch.float32
    if name == "bfloat16" and not fast_bf16(device):
        logger.warning(
            "warning: dtype bfloat16 on %s: it runs, emulated, many times slower than float32 "
            "(use float32 or auto)",
            describe_bf16(device),
        )
    return _TORCH[name]


def fp32_kept(model: torch.nn.Module) -> tuple[str, ...]:
    """Name suffixes of the parameters ``model`` keeps in fp32 whatever its dtype: the native
    model's router bias and indexer gates (as its checkpoint loader keeps them), a transformers
    model's ``_keep_in_fp32_modules``."""
    from dsv32.model import DeepseekV32
    from dsv32.model.checkpoint import _FP32_KEYS

    if isinstance(model, DeepseekV32):
        return tuple(_FP32_KEYS)
    return tuple(getattr(model, "_keep_in_fp32_modules", None) or ())


def _kept(name: str, kept: tuple[str, ...]) -> bool:
    return any(name.endswith(k) or f".{k}." in f".{name}." for k in kept)


def model_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype ``model`` computes in: that of its floating parameters other than :func:`fp32_kept`."""
    kept = fp32_kept(model)
    return next(
        (p.dtype for n, p in model.named_parameters() if p.is_floating_point() and not _kept(n, kept)),
        torch.float32,
    )


@torch.no_grad()
def cast_model(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """``model`` with its floating parameters and buffers in ``dtype`` (in place), except those
    :func:`fp32_kept` names, which stay fp32."""
    kept = fp32_kept(model)
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_floating_point():
            target = torch.float32 if _kept(name, kept) else dtype
            if tensor.dtype != target:
                tensor.data = tensor.data.to(target)
    return model


def mixed_precision(model: torch.nn.Module, dtype: str | torch.dtype) -> torch.dtype | None:
    """``dtype`` (:func:`resolve_dtype` on ``model``'s device) where it is not the dtype ``model``'s
    weights compute in, else None: the ``torch.autocast`` dtype of a training forward (bf16 mixed
    precision over fp32 weights — matmuls in bf16 with fp32 accumulation; the weights, their
    gradients and the optimizer state stay fp32), or the dtype of a sampling copy
    (:func:`sampling_copy`). None: the model runs as it is."""
    target = resolve_dtype(dtype, next(model.parameters()).device)
    return None if target == model_dtype(model) else target


def autocast(device: torch.device | str, dtype: torch.dtype | None):
    """``torch.autocast`` to ``dtype`` on ``device``'s type, or no context for None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)


def sampling_copy(model: torch.nn.Module, dtype: str | torch.dtype) -> torch.nn.Module:
    """``model`` itself when it already computes in ``dtype`` (:func:`resolve_dtype`), else a copy of
    it cast to that dtype (:func:`cast_model`; eval mode, no gradients): what samples from a trainer's
    fp32 weights in bf16. The copy holds the weights of the moment; :func:`copy_weights` refreshes it."""
    target = mixed_precision(model, dtype)
    if target is None:
        return model
    return cast_model(copy.deepcopy(model), target).eval().requires_grad_(False)


@torch.no_grad()
def copy_weights(dst: torch.nn.Module, src: torch.nn.Module) -> None:
    """Copy every parameter and buffer of ``src`` into ``dst``'s tensor of the same name, cast to
    ``dst``'s dtype (a bf16 sampling copy of an fp32 trainer); the two must have the same names."""
    theirs = dict(src.named_parameters()) | dict(src.named_buffers())
    ours = dict(dst.named_parameters()) | dict(dst.named_buffers())
    if theirs.keys() != ours.keys():
        missing = sorted(theirs.keys() ^ ours.keys())[:5]
        raise ValueError(f"the two models hold different tensors (e.g. {missing}): not copies of one model")
    for name, tensor in ours.items():
        tensor.copy_(theirs[name])
