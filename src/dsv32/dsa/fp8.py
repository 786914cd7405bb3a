"""The lightning indexer in FP8, as the released model's inference code scores it (paper §2.1: "the
lightning indexer ... can be implemented in FP8").

The reference rotates the indexer's queries and keys by a normalized Hadamard transform (orthogonal,
so exact scores do not change, while outlier dims are spread over all dims before quantizing), then
quantizes every query head vector and every key to float8 e4m3 with one fp32 scale each
(``amax / 448``, ``amax`` floored at 1e-4; rounded up to a power of two — "ue8m0" — in the FP8
inference config, kept as is in the bf16 one). Its score is

    I[t, s] = sk[s] · sum_j (w[t, j] · sq[t, j]) · ReLU(q8[t, j] · k8[s])

with fp32 accumulation. Because the scales are positive they fold into the operands, so
:func:`fp8_indexer_queries` and :func:`fp8_indexer_keys` return fp32 tensors holding the dequantized
codes, and every scorer (:func:`~dsv32.dsa.index_scores`, :func:`~dsv32.dsa.indexer_topk` with its C
and Triton kernels) computes the FP8 indexer's scores from them, equal up to the order of the fp32
sums (exactly the same products with "ue8m0" scales, which are powers of two). This reproduces the
FP8 indexer's *selection* on any device; it does not make scoring faster (the products still run in
fp32/bf16 units, not FP8 tensor cores).

Quantization is per vector: for the released ``index_head_dim`` of 128 that is the reference's
128-wide quantization block.
"""

from __future__ import annotations

import functools

import torch

FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448
AMAX_FLOOR = 1e-4  # the reference's smallest amax: an all-zero vector gets a finite scale
SCALE_FORMATS = ("ue8m0", "float")


@functools.cache
def _hadamard_matrix(d: int, device: torch.device) -> torch.Tensor:
    """The Sylvester Hadamard matrix of order ``d`` divided by ``sqrt(d)`` (fp32; symmetric)."""
    h = torch.ones(1, 1, dtype=torch.float32)
    while h.shape[0] < d:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return (h * d**-0.5).to(device)


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """``x · H / sqrt(d)`` over the last dim (``d`` a power of two; ``H`` the Sylvester Hadamard
    matrix): an orthogonal rotation, computed in fp32 (one matmul: for the indexer's 64–128 dims
    faster than butterflies in torch) and returned in ``x``'s dtype (the reference rounds the rotated
    bf16 activations back to bf16)."""
    d = x.shape[-1]
    if d < 1 or d & (d - 1):
        raise ValueError(f"the Hadamard transform needs a power-of-two last dim, got {d}")
    return (x.float() @ _hadamard_matrix(d, x.device)).to(x.dtype)


def quantize_e4m3(x: torch.Tensor, scale_format: str = "ue8m0") -> tuple[torch.Tensor, torch.Tensor]:
    """Per-vector e4m3 quantization of the last dim: ``(codes, scale)`` with ``x ≈ codes · scale``,
    ``codes`` float8_e4m3fn, ``scale`` fp32 of shape ``x.shape[:-1] + (1,)``.

    ``scale = max(amax, 1e-4) / 448``; with ``scale_format="ue8m0"`` rounded up to a power of two
    (so ``|codes| <= 448`` still holds and rescaling is exact)."""
    if scale_format not in SCALE_FORMATS:
        raise ValueError(f"scale_format must be one of {SCALE_FORMATS}, got {scale_format!r}")
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True).clamp_min(AMAX_FLOOR) * (1.0 / FP8_MAX)
    if scale_format == "ue8m0":
        mantissa, exponent = torch.frexp(scale)  # scale = mantissa · 2^exponent, mantissa in [0.5, 1)
        scale = torch.ldexp(torch.ones_like(scale), exponent - (mantissa == 0.5).to(exponent.dtype))
    codes = (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return codes, scale


def fp8_indexer_keys(k_index: torch.Tensor, scale_format: str = "ue8m0") -> torch.Tensor:
    """Index keys ``[B, S, D]`` → the FP8 indexer's keys, dequantized: Hadamard-rotated, quantized per
    key and multiplied back by their scale (fp32). Per key, so a cache may hold them."""
    codes, scale = quantize_e4m3(hadamard(k_index), scale_format)
    return codes.float() * scale


def fp8_indexer_queries(
    q: torch.Tensor, weights: torch.Tensor, scale_format: str = "ue8m0"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Indexer queries ``[B, T, H, D]`` and gates ``[B, T, H]`` → ``(codes, gates · scale)``: each head's
    rotated query quantized, its codes as fp32 and its scale folded into its gate (as the reference
    does: ``ReLU`` is positively homogeneous)."""
    codes, scale = quantize_e4m3(hadamard(q), scale_format)
    return codes.float(), weights.float() * scale.squeeze(-1)
