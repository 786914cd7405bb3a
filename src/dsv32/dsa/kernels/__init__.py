"""Hand-written kernels behind :mod:`dsv32.dsa`'s fast paths, used where the torch ops are the
bottleneck; the torch paths stay the reference they are tested against.

- :mod:`dsv32.dsa.kernels.cpu` — C (``cpu_kernels.c``, built at first use with the system compiler,
  loaded with ctypes): fused sparse MLA attention and the indexer's scores with their exact top-k,
  fp32 or bf16 inputs, without autograd.
- :mod:`dsv32.dsa.kernels.gpu` — Triton (CUDA): fused sparse MLA attention and fused indexer scoring.
"""
