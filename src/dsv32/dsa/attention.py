"""Attention over the indexer's selection (Eq. 2), in the two layouts DSA is used with.

- **MHA/GQA** (Hugging Face dense models): ``q`` ``[B, T, H, D]``, ``k`` ``[B, S, H_kv, D]``,
  ``v`` ``[B, S, H_kv, D_v]``; the selection is per query token and shared by all heads.
- **MLA, MQA mode** (DeepSeek-V3.2): every selected latent ``c[s]`` ``[C]`` (``kv_lora_rank`` +
  ``qk_rope_head_dim``) is both key and (its first ``v_dim`` dims) value for all heads; the queries are
  already absorbed into latent space, ``q`` ``[B, T, H, C]``.

``topk_indices`` ``[B, T, K]`` (int64) index keys; ``-1`` marks an empty slot (a query that sees fewer
than K keys). Each layout has a readable *reference* (dense scores, masked to the selection — O(T·S),
what transformers does) and a *sparse* path that gathers only the selected entries (O(T·K)), computed
in query chunks to bound memory. Tests hold the sparse paths to the references.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Gathered entries per chunk (chunk_queries · K); bounds the chunk buffers to a few MB.
_GATHER_BUDGET = 1 << 16


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim restricted to ``mask``; rows with no valid entry give all zeros
    (instead of NaN), which is what a padded query needs."""
    scores = scores.float().masked_fill(~mask, float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).min)
    exp = (scores - row_max).exp()
    return exp / exp.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)


def selection_mask(topk_indices: torch.Tensor, S: int) -> torch.Tensor:
    """``[B, T, K]`` indices (``-1`` = empty) → boolean ``[B, T, S]`` membership mask."""
    B, T, _ = topk_indices.shape
    mask = torch.zeros(B, T, S + 1, dtype=torch.bool, device=topk_indices.device)
    # Route the -1 slots to an extra column that is dropped afterwards.
    mask.scatter_(-1, torch.where(topk_indices < 0, S, topk_indices), True)
    return mask[..., :S]


def dense_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Plain attention for the MHA/GQA layout through ``F.scaled_dot_product_attention``.

    ``mask`` ``[B or 1, T, S]`` boolean (True = attend); ``None`` means causal with queries aligned to
    the end of the keys. Returns ``[B, T, H, D_v]``.
    """
    T, S = q.shape[1], k.shape[1]
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    gqa = q.shape[2] != k.shape[2]
    if mask is None and T == S:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale, enable_gqa=gqa)
    else:
        if mask is None:
            mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T).unsqueeze(0)
        out = F.scaled_dot_product_attention(
            qh, kh, vh, attn_mask=mask.unsqueeze(1), scale=scale, enable_gqa=gqa
        )
    return out.transpose(1, 2)


def sparse_attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, topk_indices: torch.Tensor, scale: float
) -> torch.Tensor:
    """MHA/GQA attention restricted to ``topk_indices`` by masking dense scores (O(T·S))."""
    B, T, H, _ = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    kh = k.repeat_interleave(H // Hkv, dim=2)
    vh = v.repeat_interleave(H // Hkv, dim=2)
    scores = torch.einsum("bthd,bshd->bhts", q.float(), kh.float()) * scale
    probs = masked_softmax(scores, selection_mask(topk_indices, S).unsqueeze(1))
    return torch.einsum("bhts,bshd->bthd", probs, vh.float()).to(q.dtype)


def _gather_rows(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``x`` ``[B, S, *F]``, ``indices`` ``[B, T, K]`` (-1 allowed) → ``[B, T, K, *F]``."""
    B, S = x.shape[:2]
    flat = indices.clamp_min(0) + torch.arange(B, device=x.device).view(B, 1, 1) * S
    return x.reshape(B * S, *x.shape[2:]).index_select(0, flat.reshape(-1)).view(*indices.shape, *x.shape[2:])


def _chunk(K: int, chunk_size: int | None) -> int:
    return chunk_size or max(1, _GATHER_BUDGET // max(K, 1))


def sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    topk_indices: torch.Tensor,
    scale: float,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """MHA/GQA attention that reads only the selected keys/values: O(T·K) work and memory per chunk.

    Shapes as in the module docstring; returns ``[B, T, H, D_v]`` in ``q.dtype``. Differentiable.
    """
    B, T, H, D = q.shape
    Hkv = k.shape[2]
    G = H // Hkv
    K = topk_indices.shape[-1]
    step = _chunk(K, chunk_size)
    outs = []
    for start in range(0, T, step):
        idx = topk_indices[:, start : start + step]
        Tc = idx.shape[1]
        kg = _gather_rows(k, idx)  # [B, Tc, K, Hkv, D]
        vg = _gather_rows(v, idx)  # [B, Tc, K, Hkv, Dv]
        qc = q[:, start : start + step].reshape(B * Tc, Hkv, G, D).transpose(0, 1)  # [Hkv, B*Tc, G, D]
        kc = kg.reshape(B * Tc, K, Hkv, D).permute(2, 0, 3, 1)  # [Hkv, B*Tc, D, K]
        scores = torch.matmul(qc, kc) * scale  # [Hkv, B*Tc, G, K]
        valid = (idx >= 0).reshape(1, B * Tc, 1, K)
        probs = masked_softmax(scores, valid).to(v.dtype)
        vc = vg.reshape(B * Tc, K, Hkv, -1).permute(2, 0, 1, 3)  # [Hkv, B*Tc, K, Dv]
        out = torch.matmul(probs, vc)  # [Hkv, B*Tc, G, Dv]
        outs.append(out.transpose(0, 1).reshape(B, Tc, H, -1))
    return torch.cat(outs, dim=1).to(q.dtype) if outs else q.new_empty(B, 0, H, v.shape[-1])


def sparse_mla_attention_reference(
    q: torch.Tensor, kv: torch.Tensor, topk_indices: torch.Tensor, scale: float, v_dim: int
) -> torch.Tensor:
    """MQA-mode MLA attention restricted to the selection by masking dense scores (O(T·S)).

    ``q`` ``[B, T, H, C]`` (absorbed queries), ``kv`` ``[B, S, C]`` (latent + rope key) →
    ``[B, T, H, v_dim]`` (attention-weighted latents)."""
    scores = torch.einsum("bthc,bsc->bhts", q.float(), kv.float()) * scale
    probs = masked_softmax(scores, selection_mask(topk_indices, kv.shape[1]).unsqueeze(1))
    return torch.einsum("bhts,bsc->bthc", probs, kv[..., :v_dim].float()).to(q.dtype)


def sparse_mla_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    topk_indices: torch.Tensor,
    scale: float,
    v_dim: int,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """MQA-mode MLA attention over the selected latents only (the V3.2 case): each gathered latent is
    shared by all H heads. O(T·K·H·C). Shapes as :func:`sparse_mla_attention_reference`."""
    B, T, H, C = q.shape
    K = topk_indices.shape[-1]
    step = _chunk(K, chunk_size)
    outs = []
    for start in range(0, T, step):
        idx = topk_indices[:, start : start + step]
        Tc = idx.shape[1]
        g = _gather_rows(kv, idx).view(B * Tc, K, C)  # [B*Tc, K, C]
        scores = torch.matmul(q[:, start : start + step].reshape(B * Tc, H, C), g.transpose(1, 2)) * scale
        probs = masked_softmax(scores, (idx >= 0).reshape(B * Tc, 1, K)).to(kv.dtype)
        outs.append(torch.matmul(probs, g[..., :v_dim]).view(B, Tc, H, v_dim))
    return torch.cat(outs, dim=1).to(q.dtype) if outs else q.new_empty(B, 0, H, v_dim)


def dense_mla_attention(
    q: torch.Tensor, kv: torch.Tensor, scale: float, v_dim: int, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Dense MQA-mode MLA attention (how V3.1 decodes): all visible latents, shared by all heads.

    ``mask`` ``[B or 1, T, S]`` (True = attend); ``None`` = causal, queries aligned to the end."""
    return dense_attention(q, kv.unsqueeze(2), kv[..., :v_dim].unsqueeze(2), scale, mask)
