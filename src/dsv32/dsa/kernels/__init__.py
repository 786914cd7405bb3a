"""Hand-written kernels behind :mod:`dsv32.dsa`'s fast paths, used where the torch ops are the
bottleneck; the torch paths stay the reference they are tested against.

- :mod:`dsv32.dsa.kernels.gpu` — Triton (CUDA): fused sparse MLA attention and fused indexer scoring.
"""
