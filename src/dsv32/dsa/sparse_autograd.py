"""Memory-efficient gradients of top-k sparse attention (MHA/GQA layout).

Autograd through the gather + bmm forward of :func:`~dsv32.dsa.sparse_attention` keeps every chunk's
gathered keys and values alive until the backward: ``T · H_kv · K · (D + D_v)`` floats per layer —
805 MB per layer for SmolLM2 at T = 2048, K = 256, i.e. 24 GB for its 30 layers. Like
FlashAttention, :class:`SparseAttentionFunction` keeps only ``q``, ``k``, ``v``, the selection, the
output and the per-row log-sum-exp, and recomputes each chunk's gather in the backward:

    P = exp(S − lse),  S = scale · q Kᵀ
    dV_sel = Pᵀ dO          dP = dO V_selᵀ          dS = P ⊙ (dP − rowsum(dO ⊙ O))
    dq = scale · dS K_sel   dK_sel = scale · dSᵀ q

and scatters ``dK_sel`` / ``dV_sel`` back with ``index_add_``. Extra memory is O(chunk · K) whatever
T is. Empty slots (``-1``) get probability 0, so they add nothing to any gradient.
"""

from __future__ import annotations

import torch

from dsv32.dsa import union
from dsv32.dsa.union import heads_major, query_blocks, token_major


def _flat_rows(idx: torch.Tensor, S: int, Hkv: int) -> torch.Tensor:
    """Row ids ``[B, Hkv, n, K]`` into a contiguous ``[B·S·Hkv, D]`` view of ``[B, S, Hkv, D]``, head
    major; empty slots (-1) point at row 0 of their batch (their probability is zeroed)."""
    B = idx.shape[0]
    rows = idx.clamp_min(0) * Hkv + (torch.arange(B, device=idx.device) * (S * Hkv)).view(B, 1, 1)
    return rows.unsqueeze(1) + torch.arange(Hkv, device=idx.device).view(1, Hkv, 1, 1)


def _chunk_scores(q, krows, idx, start, n, scale, Hkv, G, S):
    """Scores ``[B·Hkv·n, G, K]`` (fp32, empty slots −inf) of queries ``start..start+n`` and their
    gathered keys; also returns the scaled queries and gathered keys and the row ids."""
    B, _, H, D = q.shape
    K = idx.shape[-1]
    sel = idx[:, start : start + n]
    rows = _flat_rows(sel, S, Hkv)  # [B, Hkv, n, K]
    kg = krows.index_select(0, rows.reshape(-1)).view(B * Hkv * n, K, D)
    qc = (q[:, start : start + n] * scale).view(B, n, Hkv, G, D).transpose(1, 2).reshape(B * Hkv * n, G, D)
    scores = torch.bmm(qc, kg.transpose(1, 2)).float()
    invalid = (sel < 0).unsqueeze(1).expand(B, Hkv, n, K).reshape(B * Hkv * n, 1, K)
    return scores.masked_fill_(invalid, float("-inf")), qc, kg, rows


class SparseAttentionFunction(torch.autograd.Function):
    """``out [B, T, H, D_v] = attention of q [B, T, H, D] over k [B, S, H_kv, D], v [B, S, H_kv, D_v]``
    restricted to ``topk_indices [B, T, K]``; queries with no selected key give 0. ``chunk``: queries
    per recomputation step of the per-query gathers; ``union_ratio``: blocks of queries whose
    selections' union holds at most ``union_ratio · K`` keys run over that union instead (forward and
    backward; :mod:`dsv32.dsa.union`), 0 = never."""

    @staticmethod
    def forward(ctx, q, k, v, topk_indices, scale: float, chunk: int, union_ratio: float = 0.0):
        B, T, H, D = q.shape
        S, Hkv, Dv = k.shape[1], k.shape[2], v.shape[-1]
        G = H // Hkv
        k, v = k.contiguous(), v.contiguous()
        krows, vrows = k.view(-1, D), v.view(-1, Dv)
        out = q.new_empty(B, T, H, Dv)
        lse = torch.empty(B * Hkv, T, G, dtype=torch.float32, device=q.device)  # per (b, head, query)
        finite_min = torch.finfo(torch.float32).min
        plan = list(query_blocks(topk_indices, 0, H, union_ratio, chunk))  # reused by the backward
        for start, stop, unions in plan:
            if unions is None:  # per-query gathers
                n = stop - start
                scores, _, _, rows = _chunk_scores(q, krows, topk_indices, start, n, scale, Hkv, G, S)
                m = scores.logsumexp(-1, keepdim=True)  # [B·Hkv·n, G, 1]; -inf for empty rows
                probs = (scores - m.clamp_min(finite_min)).exp_()
                vg = vrows.index_select(0, rows.reshape(-1)).view(B * Hkv * n, -1, Dv)
                oc = torch.bmm(probs.to(v.dtype), vg)  # [B·Hkv·n, G, Dv]
                out[:, start:stop] = oc.view(B, Hkv, n, G, Dv).transpose(1, 2).reshape(B, n, H, Dv)
                lse[:, start:stop] = m.view(B * Hkv, n, G)
                continue
            for b, (keys, selected) in enumerate(unions):
                scores, _, _ = union.union_scores(q, k, b, start, stop, keys, selected, scale)
                m = scores.logsumexp(-1, keepdim=True)  # [Hkv, n, G, 1]
                probs = (scores - m.clamp_min(finite_min)).exp_().view(Hkv, -1, keys.numel())
                vu = v[b].index_select(0, keys).transpose(0, 1)  # [Hkv, U, Dv]
                out[b, start:stop] = token_major(torch.bmm(probs.to(v.dtype), vu), stop - start)
                lse[b * Hkv : (b + 1) * Hkv, start:stop] = m.squeeze(-1)
        ctx.save_for_backward(q, k, v, topk_indices, out, lse)
        ctx.scale, ctx.plan = scale, plan
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, idx, out, lse = ctx.saved_tensors
        scale = ctx.scale
        B, T, H, D = q.shape
        S, Hkv, Dv = k.shape[1], k.shape[2], v.shape[-1]
        G = H // Hkv
        krows, vrows = k.view(-1, D), v.view(-1, Dv)
        dq = torch.empty_like(q) if ctx.needs_input_grad[0] else None
        dk = torch.zeros(B * S * Hkv, D, dtype=torch.float32, device=k.device)
        dv = torch.zeros(B * S * Hkv, Dv, dtype=torch.float32, device=v.device)
        grad_out = grad_out.contiguous()
        finite_min = torch.finfo(torch.float32).min
        need_dk, need_dv = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        for start, stop, unions in ctx.plan:
            n = stop - start
            if unions is None:  # per-query gathers
                scores, qc, kg, rows = _chunk_scores(q, krows, idx, start, n, scale, Hkv, G, S)
                m = lse[:, start:stop].reshape(B * Hkv * n, G, 1).clamp_min(finite_min)
                probs = (scores - m).exp_()  # [B·Hkv·n, G, K]
                vg = vrows.index_select(0, rows.reshape(-1)).view(B * Hkv * n, -1, Dv).float()
                do = (
                    grad_out[:, start:stop].view(B, n, Hkv, G, Dv).transpose(1, 2).reshape(B * Hkv * n, G, Dv)
                )
                oc = out[:, start:stop].view(B, n, Hkv, G, Dv).transpose(1, 2).reshape(B * Hkv * n, G, Dv)
                do = do.float()
                delta = (do * oc.float()).sum(-1, keepdim=True)  # [B·Hkv·n, G, 1]
                dp = torch.bmm(do, vg.transpose(1, 2))
                ds = probs.mul_(dp - delta) if not need_dv else probs * (dp - delta)
                if need_dv:
                    dv.index_add_(0, rows.reshape(-1), torch.bmm(probs.transpose(1, 2), do).view(-1, Dv))
                if dq is not None:
                    dqc = torch.bmm(ds, kg.float()) * scale  # [B·Hkv·n, G, D]
                    dq[:, start:stop] = (
                        dqc.view(B, Hkv, n, G, D).transpose(1, 2).reshape(B, n, H, D).to(q.dtype)
                    )
                if need_dk:
                    dk.index_add_(0, rows.reshape(-1), torch.bmm(ds.transpose(1, 2), qc.float()).view(-1, D))
                continue
            for b, (keys, selected) in enumerate(unions):
                U = keys.numel()
                scores, qc, ku = union.union_scores(q, k, b, start, stop, keys, selected, scale)
                m = lse[b * Hkv : (b + 1) * Hkv, start:stop].unsqueeze(-1).clamp_min(finite_min)
                probs = (scores - m).exp_().view(Hkv, n * G, U)
                vu = v[b].index_select(0, keys).transpose(0, 1).float()  # [Hkv, U, Dv]
                do = heads_major(grad_out[b, start:stop], Hkv).float()  # [Hkv, n·G, Dv]
                delta = (do * heads_major(out[b, start:stop], Hkv).float()).sum(-1, keepdim=True)
                ds = probs * (torch.bmm(do, vu.transpose(1, 2)) - delta)  # [Hkv, n·G, U]
                # rows of the union's keys in the flat [B·S·Hkv, *] gradients, head-major like ku / vu
                rows = ((b * S + keys) * Hkv).unsqueeze(0) + torch.arange(Hkv, device=keys.device).unsqueeze(
                    1
                )
                if need_dv:
                    dv.index_add_(0, rows.reshape(-1), torch.bmm(probs.transpose(1, 2), do).reshape(-1, Dv))
                if dq is not None:
                    dq[b, start:stop] = token_major(torch.bmm(ds, ku.float()) * scale, n).to(q.dtype)
                if need_dk:
                    dk.index_add_(
                        0, rows.reshape(-1), torch.bmm(ds.transpose(1, 2), qc.float()).reshape(-1, D)
                    )
        dk = dk.view(B, S, Hkv, D).to(k.dtype) if ctx.needs_input_grad[1] else None
        dv = dv.view(B, S, Hkv, Dv).to(v.dtype) if ctx.needs_input_grad[2] else None
        return dq, dk, dv, None, None, None, None
