"""The machine a trainer record was written on: a record read on the same fingerprint holds bit for bit,
on another within :data:`helpers.tolerances.OTHER_CPU`."""

from __future__ import annotations

import platform

import torch


def fingerprint() -> dict:
    """torch's version, the CPU capability its kernels dispatch to and the machine's architecture."""
    return {
        "torch": torch.__version__,
        "cpu": torch.backends.cpu.get_cpu_capability(),
        "machine": platform.machine(),
    }
