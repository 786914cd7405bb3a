"""The indexer of an HF attention layer and what a DSA layer exposes to training and evaluation."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv32.dsa.hf.config import DSAError
from dsv32.dsa.indexer import IndexerQueries, LightningIndexer, indexer_topk
from dsv32.dsa.loss import indexer_kl_loss_chunked


class HFIndexer(LightningIndexer):
    """:class:`~dsv32.dsa.LightningIndexer` fed by an HF attention layer: ``q_I`` projects the hidden
    state; RoPE angles come from the model's ``position_embeddings`` (``cos``/``sin`` ``[B, T,
    head_dim]``, half-split: the first half holds one angle per frequency)."""

    def __init__(
        self, hidden_size: int, n_heads: int, head_dim: int, rope_head_dim: int, model_head_dim: int
    ):
        super().__init__(hidden_size, n_heads, head_dim, rope_head_dim)
        freqs, pairs = model_head_dim // 2, rope_head_dim // 2
        if pairs and freqs % pairs:
            raise DSAError(
                f"index_rope_head_dim={rope_head_dim}: its {pairs} rotated pairs must divide the model's "
                f"{freqs} rotary frequencies (head_dim {model_head_dim})"
            )
        self.model_freqs = freqs
        self.freq_stride = freqs // pairs if pairs else 1

    def rope_angles(self, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """HF ``cos``/``sin`` ``[B, T, head_dim]`` → the indexer's ``[B, T, rope_head_dim / 2]`` (fp32)."""
        pick = slice(0, self.model_freqs, self.freq_stride)
        return cos[..., pick].float(), sin[..., pick].float()

    def inputs_dtype(self) -> torch.dtype:
        return self.wk.weight.dtype


def query_rows_projection(
    indexer: HFIndexer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rows: torch.Tensor | None
) -> IndexerQueries:
    """The indexer's queries of ``x`` ``[B, T, hidden]`` (RoPE angles ``cos``/``sin`` ``[B or 1, T,
    r/2]``) as ``[B, T, ...]`` tensors, projected only at ``rows`` (the other rows are zero, and no
    gradient reaches the indexer through them); None: every row."""
    if rows is None:
        return indexer.project_queries(x, x, cos, sin)
    B, T = x.shape[:2]
    xr = x[:, rows]
    part = indexer.project_queries(xr, xr, cos[:, rows], sin[:, rows])
    q = part.q.new_zeros(B, T, *part.q.shape[2:]).index_copy(1, rows, part.q)
    weights = part.weights.new_zeros(B, T, part.weights.shape[2]).index_copy(1, rows, part.weights)
    return IndexerQueries(q=q, weights=weights)


@dataclass
class LayerView:
    """One DSA layer's inputs in a cache-free forward (all detached from the model's graph).

    ``hidden`` ``[B, T, hidden]`` (the attention input), ``cos``/``sin`` the indexer's RoPE angles
    ``[B, T, r/2]``, ``q`` ``[B, T, H, D]`` and ``k`` ``[B, T, H_kv, D]`` the main attention's queries
    and keys after RoPE, ``scale`` its softmax scale, ``topk_indices`` the selection when the layer ran
    sparse (else None), ``key_padding_mask`` ``[B, T]`` or None.
    """

    layer_idx: int
    indexer: HFIndexer
    hidden: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    scale: float
    topk_indices: torch.Tensor | None = None
    key_padding_mask: torch.Tensor | None = None

    def index_inputs(self, indexer: HFIndexer | None = None) -> tuple[IndexerQueries, torch.Tensor]:
        """The indexer's queries and keys (differentiable w.r.t. the indexer's parameters)."""
        idx = indexer or self.indexer
        x = self.hidden.to(idx.inputs_dtype())
        return idx.project_queries(x, x, self.cos, self.sin), idx.project_keys(x, self.cos, self.sin)

    def topk(self, k: int, indexer: HFIndexer | None = None) -> torch.Tensor:
        """``topk_indices`` ``[B, T, min(k, T)]`` of ``indexer`` (default: the layer's own)."""
        with torch.no_grad():
            iq, ik = self.index_inputs(indexer)
            return indexer_topk(iq.q, iq.weights, ik, k, key_padding_mask=self.key_padding_mask)

    def indexer_loss(
        self, topk_indices: torch.Tensor | None = None, query_rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Eq. 3 (``topk_indices`` None) or Eq. 4 of this layer's indexer, differentiable w.r.t. it.
        With ``query_rows`` only those rows' indexer queries are projected (the loss reads no other)."""
        idx = self.indexer
        x = self.hidden.to(idx.inputs_dtype())
        ik = idx.project_keys(x, self.cos, self.sin)
        iq = query_rows_projection(idx, x, self.cos, self.sin, query_rows)
        return indexer_kl_loss_chunked(
            self.q,
            self.k,
            iq.q,
            iq.weights,
            ik,
            scale=self.scale,
            topk_indices=topk_indices,
            key_padding_mask=self.key_padding_mask,
            query_rows=query_rows,
        )
