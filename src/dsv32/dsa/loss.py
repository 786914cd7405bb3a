"""The indexer's training objective (paper §2.1.1, Eq. 3 and 4) and the attention-recall metric.

    L_I = mean_t KL( p[t, S_t] || Softmax(I[t, S_t]) )                                 (Eq. 3 / 4)

``p[t, :]`` is the main attention of query t summed over heads and L1-normalized over the key set
``S_t``: every visible key (dense warm-up, Eq. 3) or the indexer's top-k selection (sparse stage,
Eq. 4). The paper writes a sum over t; we average over batch and queries so the value does not grow
with the sequence length (the gradient direction is the same). Queries with an empty key set (padding)
are left out.

Two forms compute the same value:

- :func:`indexer_kl_loss` — literal: takes the attention probabilities ``[B, H, T, S]`` and the index
  scores ``[B, T, S]``;
- :func:`indexer_kl_loss_chunked` — takes the main attention's queries/keys and the indexer's
  projections and recomputes both, a chunk of queries at a time, so nothing ``T × S`` (let alone
  ``H × T × S``) is ever held: warm-up runs at long context. Its gradient is computed chunk by chunk
  *during the forward* (the loss is a scalar, so ``d loss / d inputs`` only needs rescaling by the
  incoming gradient): one pass, no recomputation.

Gradient isolation (§2.1.1): both forms treat the attention side (``attn_probs``, or ``q``/``k``) as a
constant — the target never sends gradient into the main model; only the indexer side is differentiable.

:func:`attention_recall` measures how much of the dense attention mass the indexer's selection keeps,
beside the best possible selection of the same size (the oracle top-k of the head-summed attention).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

from dsv32.dsa.indexer import visible_mask

# Query rows per chunk of the chunked losses: chunk · heads · visible keys ≈ this many fp32 logits per
# sequence. On the CPU a cache-sized budget (8 MB); on CUDA a memory budget (128 MB of logits, under
# 1 GB of chunk temporaries per sequence with the indexer's) that keeps kernels large and chunks few.
LOSS_CHUNK_ELEMS = 1 << 21
LOSS_CHUNK_ELEMS_CUDA = 1 << 25


def _fp32(device: torch.device):
    """Autocast off: the loss's matmuls run in fp32 even inside a model's bf16 autocast region (the
    indexer's scores are fp32 by contract, and a bf16 ``d_ik`` could not be added into fp32 sums)."""
    return torch.autocast(device.type, enabled=False)


def _key_set(
    T: int, S: int, device, key_padding_mask: torch.Tensor | None, topk_indices: torch.Tensor | None
) -> torch.Tensor:
    """Boolean ``[B or 1, T, S]``: the keys S_t of each query (visible, and selected if given)."""
    mask = visible_mask(T, S, device, key_padding_mask)
    if topk_indices is not None:
        sel = torch.zeros(topk_indices.shape[0], T, S + 1, dtype=torch.bool, device=device)
        sel.scatter_(-1, torch.where(topk_indices < 0, S, topk_indices), True)
        mask = mask & sel[..., :S]
    return mask


def _kl_rows(
    target: torch.Tensor, scores: torch.Tensor, keys: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row KL(p || softmax(scores)) over ``keys`` (bool, same shape); ``target`` is the unnormalized
    head-summed attention. Returns (row KL sums over valid rows, number of valid rows)."""
    target = target.masked_fill(~keys, 0.0)
    mass = target.sum(-1, keepdim=True)
    valid = (mass.squeeze(-1) > 0) & keys.any(-1)
    p = target / mass.clamp_min(torch.finfo(torch.float32).tiny)
    log_q = torch.log_softmax(scores.float().masked_fill(~keys, float("-inf")), dim=-1)
    # 0 · log 0 = 0: keys with zero target mass contribute nothing (and no NaN from -inf).
    terms = torch.where(p > 0, p * (p.clamp_min(torch.finfo(torch.float32).tiny).log() - log_q), 0.0)
    rows = terms.sum(-1)
    return rows.masked_fill(~valid, 0.0).sum(), valid.sum()


def indexer_kl_loss(
    attn_probs: torch.Tensor,
    index_scores: torch.Tensor,
    topk_indices: torch.Tensor | None = None,
    *,
    key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Eq. 3 (``topk_indices`` None) or Eq. 4 (over the selection), averaged over batch and queries.

    Args:
        attn_probs: ``[B, H, T, S]`` main attention probabilities (treated as a constant target).
        index_scores: ``[B, T, S]`` raw indexer scores (differentiable); the causal mask is applied
            here, keys aligned to the end (key s is visible to query t when ``s <= t + S - T``).
        topk_indices: ``[B, T, k]`` selected keys (``-1`` = empty slot) for Eq. 4.
        key_padding_mask: ``[B, S]`` True for real keys.

    Returns a scalar fp32 tensor.
    """
    if attn_probs.dim() != 4 or index_scores.dim() != 3 or attn_probs.shape[2:] != index_scores.shape[1:]:
        raise ValueError(
            f"indexer_kl_loss expects attn_probs [B, H, T, S] and index_scores [B, T, S]; got "
            f"{tuple(attn_probs.shape)} and {tuple(index_scores.shape)}"
        )
    T, S = index_scores.shape[1:]
    keys = _key_set(T, S, index_scores.device, key_padding_mask, topk_indices)
    keys = keys.expand(index_scores.shape)
    with _fp32(index_scores.device):
        total, count = _kl_rows(attn_probs.detach().float().sum(1), index_scores, keys)
        return total / count.clamp_min(1)


def _attention_logits(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``q`` ``[B, n, H, D]``, ``k`` ``[B, S, H_kv, D]`` → logits ``[B, n, H, S]`` (GQA: query head h uses
    KV head ``h // (H / H_kv)``), fp32."""
    B, n, H, D = q.shape
    Hkv = k.shape[2]
    qg = q.float().view(B, n, Hkv, H // Hkv, D).permute(0, 2, 1, 3, 4).reshape(B, Hkv, n * (H // Hkv), D)
    with _fp32(q.device):
        logits = torch.matmul(qg, k.float().permute(0, 2, 3, 1))  # [B, Hkv, n·G, S]
    return logits.view(B, Hkv, n, H // Hkv, -1).permute(0, 2, 1, 3, 4).reshape(B, n, H, -1)


class _Chunked:
    """Shared state of one chunked pass: fp32 keys laid out for the per-chunk matmuls, gradient
    accumulators. Per chunk of query ``rows`` it returns (sum of row KLs, valid rows) and, when
    ``grads``, adds ``d(sum of row KLs)`` to ``g_iq``/``g_iw``/``g_ik`` (manual backward of Eq. 1 + KL)."""

    def __init__(self, q, k, scale, iq, iw, ik, topk_indices, key_padding_mask, grads):
        self.B, self.T, self.H, _ = q.shape
        self.S, self.Hkv = k.shape[1], k.shape[2]
        self.q, self.k, self.scale = q, k, scale
        self.iq, self.iw, self.ik = iq, iw, ik.float()
        self.topk, self.pad = topk_indices, None if key_padding_mask is None else key_padding_mask.bool()
        if topk_indices is None:
            self.kT = k.float().permute(0, 2, 3, 1).contiguous()  # [B, Hkv, D, S]
            self.ikT = self.ik.transpose(1, 2).contiguous()  # [B, D_I, S]
        self.grads = grads
        if grads:
            self.g_iq = torch.zeros_like(iq, dtype=torch.float32)
            self.g_iw = torch.zeros_like(iw, dtype=torch.float32)
            self.g_ik = torch.zeros_like(self.ik)

    def __call__(self, rows: torch.Tensor, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``rows``: the chunk's query positions; ``w``: one past the last key any of them sees (given
        by the caller, so no chunk reads it back from the device)."""
        B, H, Hkv = self.B, self.H, self.Hkv
        G = H // Hkv
        n = rows.numel()
        last = rows + (self.S - self.T)  # last visible key of each query
        batch = torch.arange(B, device=rows.device).view(B, 1, 1)
        qc = (self.q[:, rows].float() * self.scale).view(B, n, Hkv, G, -1)
        iq = self.iq[:, rows].float()  # [B, n, H_I, D_I]
        iw = self.iw[:, rows].float()  # [B, n, H_I]
        HI, DI = iq.shape[2:]
        if self.topk is None:  # keys after the chunk's last query are never visible: skip them
            keys = (torch.arange(w, device=rows.device) <= last.unsqueeze(1)).unsqueeze(0)  # [1, n, w]
            if self.pad is not None:
                keys = keys & self.pad[:, :w].unsqueeze(1)
            logits = torch.matmul(qc.transpose(1, 2).reshape(B, Hkv, n * G, -1), self.kT[..., :w])
            logits = logits.view(B, Hkv, n, G, w)
            ik = self.ikT[..., :w]  # [B, D_I, w]
            relu = torch.matmul(iq.reshape(B, n * HI, DI), ik).relu_().view(B, n, HI, w)
        else:
            sel = self.topk[:, rows]  # [B, n, K]
            gather = sel.clamp_min(0)
            keys = (sel >= 0) & (sel <= last.view(1, -1, 1))
            if self.pad is not None:
                keys = keys & self.pad.gather(1, gather.flatten(1)).view_as(sel)
            w = sel.shape[-1]
            kg = self.k[batch, gather].float()  # [B, n, K, Hkv, D]
            logits = torch.einsum("bnvgd,bnkvd->bvngk", qc, kg)  # [B, Hkv, n, G, K]
            ik = self.ik[batch, gather]  # [B, n, K, D_I]
            relu = torch.matmul(iq, ik.transpose(-1, -2)).relu_()  # [B, n, H_I, K]
        bias = torch.zeros(keys.shape, device=rows.device).masked_fill_(~keys, float("-inf"))
        logits += bias.view(bias.shape[0], 1, n, 1, w)
        # Head-summed attention; rows with no visible key (NaN from an all -inf row) become 0 and are
        # left out below. Only those: a NaN from the inputs must reach the loss, not vanish.
        seen = keys.any(-1, keepdim=True)  # [B or 1, n, 1]: the query sees a key
        target = torch.softmax(logits, dim=-1).sum((1, 3)).masked_fill_(~seen, 0.0)  # [B, n, w]
        del logits
        scores = torch.matmul(iw.unsqueeze(2), relu).squeeze(2)  # Eq. 1, [B, n, w]
        mass = target.sum(-1, keepdim=True)
        valid = seen.squeeze(-1).expand(mass.shape[0], -1)
        p = target.div_(mass.clamp_min_(torch.finfo(torch.float32).tiny))
        log_q = torch.log_softmax(scores + bias, dim=-1)
        rows_kl = torch.xlogy(p, p).sum(-1) - (p * log_q.masked_fill(~keys, 0.0)).sum(-1)
        total = rows_kl.masked_fill_(~valid, 0.0).sum()
        if self.grads:
            # d KL_row / d scores = softmax(scores over S_t) - p; then back through Eq. 1.
            d_scores = (log_q.exp_() - p).masked_fill_(~valid.unsqueeze(-1), 0.0)  # [B, n, w]
            self.g_iw[:, rows] += torch.matmul(relu, d_scores.unsqueeze(-1)).squeeze(-1)
            d_relu = (iw.unsqueeze(-1) * d_scores.unsqueeze(2)).masked_fill_(relu <= 0, 0.0)  # [B, n, H_I, w]
            if self.topk is None:
                d_flat = d_relu.view(B, n * HI, w)
                self.g_iq[:, rows] += torch.matmul(d_flat, ik.transpose(1, 2)).view(B, n, HI, DI)
                self.g_ik[:, :w] += torch.matmul(d_flat.transpose(1, 2), iq.reshape(B, n * HI, DI))
            else:
                self.g_iq[:, rows] += torch.matmul(d_relu, ik)
                d_ik = torch.matmul(d_relu.transpose(-1, -2), iq)  # [B, n, K, D_I]
                flat = (gather + batch * self.S).flatten()
                d_ik = d_ik.masked_fill_((sel < 0).unsqueeze(-1), 0.0).reshape(-1, DI)
                self.g_ik.view(-1, DI).index_add_(0, flat, d_ik)
        return total, valid.sum()


def _default_chunk(heads: int, width: int, device: torch.device | str = "cpu") -> int:
    """Query rows per chunk: :data:`LOSS_CHUNK_ELEMS` (CPU) or :data:`LOSS_CHUNK_ELEMS_CUDA` logits."""
    budget = LOSS_CHUNK_ELEMS_CUDA if torch.device(device).type == "cuda" else LOSS_CHUNK_ELEMS
    return max(1, budget // max(1, heads * width))


def _chunk_widths(query_rows: torch.Tensor | None, T: int, S: int, chunk: int) -> list[int]:
    """Per chunk of ``chunk`` query rows, one past the last key its queries see — from the host (one
    copy of ``query_rows`` per call, nothing per chunk)."""
    if query_rows is None:
        return [min(a + chunk, T) + S - T for a in range(0, T, chunk)]
    rows = query_rows.cpu().tolist()
    return [max(rows[a : a + chunk]) + 1 + S - T for a in range(0, len(rows), chunk)]


class _ChunkedIndexerKL(torch.autograd.Function):
    """Chunked Eq. 3/4 whose input gradients are accumulated during the forward pass."""

    @staticmethod
    def forward(
        ctx, iq, iw, ik, q, k, scale, topk_indices, key_padding_mask, query_rows, chunk, grads, widths
    ):
        with _fp32(q.device):
            run = _Chunked(q, k, scale, iq, iw, ik, topk_indices, key_padding_mask, grads)
            total = torch.zeros((), dtype=torch.float32, device=q.device)
            count = torch.zeros((), dtype=torch.long, device=q.device)
            for a, w in zip(range(0, query_rows.numel(), chunk), widths):
                s, c = run(query_rows[a : a + chunk], w)
                total += s
                count += c
            n = count.clamp_min(1).to(torch.float32)
        if grads:
            ctx.save_for_backward(run.g_iq / n, run.g_iw / n, run.g_ik / n)
            ctx.dtypes = (iq.dtype, iw.dtype, ik.dtype)
        return total / n

    @staticmethod
    def backward(ctx, grad_out):
        g_iq, g_iw, g_ik = ctx.saved_tensors
        d_iq, d_iw, d_ik = ctx.dtypes
        with _fp32(g_iq.device):
            grad_out = grad_out.float()
            return (
                (g_iq * grad_out).to(d_iq),
                (g_iw * grad_out).to(d_iw),
                (g_ik * grad_out).to(d_ik),
                *([None] * 9),
            )


def indexer_kl_loss_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    index_q: torch.Tensor,
    index_weights: torch.Tensor,
    index_k: torch.Tensor,
    *,
    scale: float,
    topk_indices: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    query_rows: torch.Tensor | None = None,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Eq. 3 / Eq. 4 without materializing ``[B, H, T, S]``: the main attention is recomputed from its
    queries and keys chunk by chunk. Equals

        indexer_kl_loss(softmax(q·k·scale over S_t), index_scores(index_q, index_weights, index_k),
                        topk_indices)

    where the softmax runs over every visible key (Eq. 3, the dense warm-up's attention) or, with
    ``topk_indices``, over the selected visible keys (Eq. 4: in the sparse stage the main attention
    *is* a softmax over the selection).

    Args:
        q: ``[B, T, H, D]`` main-attention queries after RoPE (a constant: detached here).
        k: ``[B, S, H_kv, D]`` keys after RoPE (GQA/MQA: ``H`` a multiple of ``H_kv``); constant.
        index_q: ``[B, T, H_I, D_I]``, index_weights: ``[B, T, H_I]``, index_k: ``[B, S, D_I]`` — the
            indexer's projections (Eq. 1); the loss is differentiable w.r.t. these three.
        scale: the main attention's softmax scale.
        topk_indices: ``[B, T, k]`` (``-1`` = empty) for Eq. 4; only the selected keys are read.
        key_padding_mask: ``[B, S]`` True for real keys.
        query_rows: optional 1-D ascending query positions to average over (a subsample; default all).
        chunk_size: query rows per chunk (default: about :data:`LOSS_CHUNK_ELEMS` logits per chunk).

    Returns a scalar fp32 tensor (mean over the batch and the queries with a non-empty key set).
    """
    if q.dim() != 4 or k.dim() != 4 or q.shape[2] % k.shape[2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q must be [B, T, H, D] and k [B, S, H_kv, D] with H a multiple of H_kv; got "
            f"{tuple(q.shape)} and {tuple(k.shape)}"
        )
    B, T, H, _ = q.shape
    S = k.shape[1]
    if index_q.shape[:2] != (B, T) or index_weights.shape != index_q.shape[:3] or index_k.shape[:2] != (B, S):
        raise ValueError(
            f"indexer projections do not match q/k: index_q {tuple(index_q.shape)}, index_weights "
            f"{tuple(index_weights.shape)}, index_k {tuple(index_k.shape)} for B={B}, T={T}, S={S}"
        )
    if S < T:
        raise ValueError(f"{T} queries but only {S} keys: queries are aligned to the end of the keys")
    rows = torch.arange(T, device=q.device) if query_rows is None else query_rows.to(q.device, torch.long)
    width = S if topk_indices is None else topk_indices.shape[-1]
    chunk = chunk_size or _default_chunk(H + index_q.shape[2], width, q.device)
    widths = (
        _chunk_widths(query_rows, T, S, chunk)
        if topk_indices is None
        else [width] * -(-rows.numel() // chunk)
    )
    grads = torch.is_grad_enabled() and any(t.requires_grad for t in (index_q, index_weights, index_k))
    return _ChunkedIndexerKL.apply(
        index_q,
        index_weights,
        index_k,
        q.detach(),
        k.detach(),
        scale,
        topk_indices,
        key_padding_mask,
        rows,
        chunk,
        grads,
        widths,
    )


@dataclass
class RecallSums:
    """Sums over queries (divide by ``queries``): ``recall`` — dense attention mass inside the selection;
    ``oracle`` — the mass inside the best possible selection of the same size."""

    recall: float = 0.0
    oracle: float = 0.0
    queries: int = 0

    def add(self, other: RecallSums) -> None:
        self.recall += other.recall
        self.oracle += other.oracle
        self.queries += other.queries

    @property
    def mean_recall(self) -> float:
        return self.recall / self.queries if self.queries else float("nan")

    @property
    def mean_oracle(self) -> float:
        return self.oracle / self.queries if self.queries else float("nan")


@torch.no_grad()
def _head_summed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    scale: float,
    key_padding_mask: torch.Tensor | None,
    chunk: int,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Dense attention probabilities summed over heads, chunk of queries by chunk: yields ``rows``
    ``[n]`` (query indices), ``keys`` ``[B or 1, n, width]`` (which of the first ``width`` keys each
    query may see) and ``p`` ``[B, n, width]``; queries aligned to the end of the keys, padded keys
    and queries that see nothing get probability 0."""
    T, S = q.shape[1], k.shape[1]
    for a in range(0, T, chunk):
        rows = torch.arange(a, min(a + chunk, T), device=q.device)
        last = rows + (S - T)
        width = int(last.max()) + 1
        keys = (torch.arange(width, device=q.device) <= last.unsqueeze(1)).unsqueeze(0)
        if key_padding_mask is not None:
            keys = keys & key_padding_mask[:, :width].bool().unsqueeze(1)
        logits = (_attention_logits(q[:, rows], k[:, :width]) * scale).masked_fill(
            ~keys.unsqueeze(2), float("-inf")
        )
        yield rows, keys, torch.nan_to_num(torch.softmax(logits, dim=-1), nan=0.0).sum(2)


def attention_recall(
    q: torch.Tensor,
    k: torch.Tensor,
    selections: Mapping[str, torch.Tensor] | torch.Tensor,
    *,
    scale: float,
    key_padding_mask: torch.Tensor | None = None,
    chunk_size: int | None = None,
) -> dict[str, RecallSums] | RecallSums:
    """Attention recall of top-k selections against the dense attention of ``q``/``k``.

    For each query that sees *more* than k keys (for the others every selection is trivially complete),
    recall is the share of the dense attention mass — averaged over heads, i.e. of the head-mean
    probabilities — that falls inside the selection; the oracle is the same share for the k keys with
    the largest head-summed attention. Shapes as :func:`indexer_kl_loss_chunked`; ``selections`` maps
    names to ``topk_indices`` ``[B, T, k]`` (one tensor gives one :class:`RecallSums`).
    """
    single = isinstance(selections, torch.Tensor)
    sels = {"": selections} if single else dict(selections)
    B, T, H, _ = q.shape
    S = k.shape[1]
    for name, idx in sels.items():
        label = f"selection {name!r}" if name else "the selection"
        if idx.dim() != 3 or tuple(idx.shape[:2]) != (B, T):
            raise ValueError(
                f"{label} must be topk_indices [B, T, k] with (B, T) = {(B, T)}, got {tuple(idx.shape)}"
            )
        if idx.numel() and int(idx.max()) >= S:
            raise IndexError(f"{label} selects key {int(idx.max())} but there are only {S} keys")
    out = {name: RecallSums() for name in sels}
    chunk = chunk_size or _default_chunk(H, S, q.device)
    n_visible_pad = None
    if key_padding_mask is not None:
        n_visible_pad = key_padding_mask.bool().long().cumsum(-1)  # real keys up to each position
    for rows, _, p in _head_summed_attention(q, k, scale, key_padding_mask, chunk):
        last = rows + (S - T)
        width = p.shape[-1]
        if n_visible_pad is not None:
            seen = n_visible_pad[:, last]  # [B, n]
        else:
            seen = (last + 1).unsqueeze(0).expand(B, -1)
        p = p / H  # head-averaged attention [B, n, width]
        counted = {name: seen > idx.shape[-1] for name, idx in sels.items()}
        needed = [idx.shape[-1] for name, idx in sels.items() if bool(counted[name].any())]
        if not needed:
            continue
        best_sorted = p.topk(min(max(needed), width), dim=-1).values  # the oracle: largest masses first
        for name, idx in sels.items():
            rows_in = counted[name]
            if not bool(rows_in.any()):
                continue
            sel = idx[:, rows]
            inside = torch.where(sel >= 0, p.gather(-1, sel.clamp(0, width - 1)), 0.0).sum(-1)
            best = best_sorted[..., : idx.shape[-1]].sum(-1)
            out[name].add(
                RecallSums(
                    recall=float(inside[rows_in].sum()),
                    oracle=float(best[rows_in].sum()),
                    queries=int(rows_in.sum()),
                )
            )
    return out[""] if single else out


@torch.no_grad()
def oracle_topk(
    q: torch.Tensor,
    k: torch.Tensor,
    topk: int,
    *,
    scale: float,
    key_padding_mask: torch.Tensor | None = None,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """The best possible selection: per query, the ``topk`` keys with the largest head-summed dense
    attention (what a perfect indexer would pick; the oracle of :func:`attention_recall`).

    Shapes as :func:`attention_recall`; returns ``topk_indices`` ``[B, T, min(topk, S)]`` with ``-1`` in
    the slots of queries that see fewer keys. Evaluation only: it computes the dense attention.
    """
    B, T, H, _ = q.shape
    S = k.shape[1]
    K = min(topk, S)
    out = torch.full((B, T, K), -1, dtype=torch.long, device=q.device)
    chunk = chunk_size or _default_chunk(H, S, q.device)
    for rows, keys, p in _head_summed_attention(q, k, scale, key_padding_mask, chunk):
        n_take = min(K, p.shape[-1])
        values, idx = p.masked_fill(~keys, -1.0).topk(n_take, dim=-1)
        out[:, rows, :n_take] = idx.masked_fill(values < 0, -1)
    return out
