"""The numeric tolerances several test modules assert with, each with what it allows for."""

from __future__ import annotations

#: On-policy: the training forward's log-probs of the sampled tokens against the sampling log-probs (the
#: same weights, Keep Sampling Mask and Keep Routing): equal up to float32 rounding of another batch
#: layout, absolute.
ON_POLICY = 1e-4

#: A run in 2 processes against 1 process: (relative, absolute) by dtype. fp64 weights are compared
#: element by element; fp32 weights by the norm of each tensor's difference relative to its norm (Adam
#: turns the rounding noise of a gradient entry that cancels to ~0 into an update difference of that
#: entry far above its relative rounding).
PROCESSES = {"float64": (1e-10, 0.0), "float32": (1e-5, 1e-7)}

#: A trainer record read on another CPU than the one that wrote it (kernels differ in their last bits
#: across instruction sets): relative. On the same machine the record holds bit for bit.
OTHER_CPU = 1e-5
