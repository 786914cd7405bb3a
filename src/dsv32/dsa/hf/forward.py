"""The replacement ``forward`` of a DSA layer on a Hugging Face attention module.

One call, in steps: project q/k/v with the model's own modules and RoPE (:func:`_project`); when the
layer needs the indexer, score and select (:func:`_index`: index keys kept on the KV cache, the
indexer's or the oracle's top-k, the training loss and the observer's view); then attend — densely
through the model's own attention function when nothing was selected (:func:`_dense_output`, identical
to the original model), else over the selection (:func:`_sparse_output`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from dsv32.dsa.attention import (
    dense_attention,
    gqa_kernel_would_run,
    nonempty_rows,
    prefer_dense,
    selection_mask,
    sparse_attention,
)
from dsv32.dsa.hf.config import DSAError
from dsv32.dsa.hf.growing import GrowingTensor
from dsv32.dsa.hf.handle import DSAHandle
from dsv32.dsa.hf.layer import HFIndexer, LayerView, query_rows_projection
from dsv32.dsa.indexer import indexer_topk
from dsv32.dsa.keep import (
    IndexingError,
    dense_positions,
    key_positions,
    pad_slots,
    row_offsets,
    to_columns,
    to_positions,
)
from dsv32.dsa.loss import indexer_kl_loss_chunked, oracle_topk

INDEX_KEYS_ATTR = "_dsa_index_keys"  # the cache attribute holding past indexer keys, {layer: [B, S, d]}
_GROWTH_ATTR = "_dsa_index_growth"  # {layer: GrowingTensor}, the buffers behind those keys


@dataclass
class _Projected:
    """The main attention's inputs after RoPE (and the cache): ``q`` ``[B, H, T, D]``, ``k``/``v``
    ``[B, H_kv, S, D]``, and the model's RoPE ``cos``/``sin``."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor

    @property
    def fresh(self) -> bool:
        """No cached prefix: the losses and the observer see whole sequences."""
        return self.k.shape[2] == self.q.shape[2]


def dsa_forward(
    self,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    attention_mask: torch.Tensor | None = None,
    cache=None,
    **kwargs,
):
    """Replacement ``forward`` of a Llama-family attention module (see :mod:`dsv32.dsa.hf`).

    ``cache`` is the KV cache, the fourth argument of the module's own ``forward``: transformers
    passes it by keyword as ``cache`` from 5.24 on and as ``past_key_values`` before; both are taken."""
    if cache is None:
        cache = kwargs.pop("past_key_values", None)
    else:
        kwargs.pop("past_key_values", None)
    handle: DSAHandle = self.__dict__["_dsa_handle"]
    cfg = handle.config
    if cfg.mode == "off":  # the cache goes back in the original's own (fourth) position
        original = type(self).forward
        return original(self, hidden_states, position_embeddings, attention_mask, cache, **kwargs)
    p = _project(self, hidden_states, position_embeddings, cache)
    S = p.k.shape[2]
    sparse = cfg.mode == "sparse" and cfg.index_topk < S
    observe = p.fresh and (handle.collect_loss or handle.observer is not None)
    keep_keys = cfg.mode == "sparse" and cache is not None
    # A fresh sparse-mode forward runs the indexer whether or not its length selects: under FSDP
    # each call gathers the indexer's shard, and every rank must make the same calls.
    fresh_sparse = cfg.mode == "sparse" and p.fresh
    topk_indices = None
    if sparse or observe or keep_keys or fresh_sparse:
        kept = cache if keep_keys else None
        topk_indices = _index(self, handle, hidden_states, p, attention_mask, kept, sparse, observe)
    if handle.record_topk:
        _record(self, handle, p, attention_mask, topk_indices)
    if topk_indices is None:
        return _dense_output(self, handle, p, attention_mask, **kwargs)
    return _sparse_output(self, handle, p, topk_indices), None


def _project(self, hidden_states, position_embeddings, cache) -> _Projected:
    modeling = sys.modules[type(self).__module__]
    B, T = hidden_states.shape[:2]
    shape = (B, T, -1, self.head_dim)
    q = self.q_proj(hidden_states).view(shape)
    k = self.k_proj(hidden_states).view(shape)
    v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
    if hasattr(self, "q_norm"):  # Qwen3: RMSNorm over each head
        q, k = self.q_norm(q), self.k_norm(k)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    cos, sin = position_embeddings
    q, k = modeling.apply_rotary_pos_emb(q, k, cos, sin)
    if cache is not None:
        k, v = cache.update(k, v, self.layer_idx)
    return _Projected(q, k, v, cos, sin)


def _index(
    self, handle: DSAHandle, hidden_states, p: _Projected, attention_mask, cache, sparse: bool, observe: bool
):
    """Run the indexer: keep its keys on ``cache``, select (when ``sparse``), and when ``observe``
    (a fresh sequence) record the indexer loss and the observer's view. Returns the selection or None."""
    cfg = handle.config
    indexer: HFIndexer = self.indexer
    S = p.k.shape[2]
    # The indexer reads detached inputs: it learns only from its own KL loss (paper §2.1.1).
    x = hidden_states.detach().to(indexer.inputs_dtype())
    icos, isin = indexer.rope_angles(p.cos, p.sin)
    keys = _index_keys(self, cache, indexer.project_keys(x, icos, isin), S)
    forced = None if handle.forced_topk is None else handle.forced_topk.get(self.layer_idx)
    # the queries of a fresh sparse-mode forward, also below top-k (the same calls on every rank)
    selects = cfg.mode == "sparse" and forced is None and not handle.oracle
    if not (sparse or observe or (selects and p.fresh)):
        return None  # decoding in sparse mode below top-k: only the keys are kept
    padding = _key_padding(attention_mask, S)
    # Dense (warm-up): only the loss reads the queries, and only at its query rows.
    loss = observe and handle.collect_loss
    rows = None if sparse or selects else handle.loss_query_rows
    queries = query_rows_projection(indexer, x, icos, isin, rows) if selects or loss else None
    qt, kt = p.q.transpose(1, 2).detach(), p.k.transpose(1, 2).detach()
    topk_indices = forced_cols = None
    if forced is not None and (sparse or loss):  # Keep Indexing: the sampled selection (row positions)
        B = hidden_states.shape[0]
        offsets = row_offsets(padding, B, hidden_states.device)
        forced_cols = to_columns(forced.to(hidden_states.device), offsets, S)
    if sparse and forced_cols is not None:
        topk_indices = forced_cols
    elif sparse and handle.oracle:
        topk_indices = oracle_topk(qt, kt, cfg.index_topk, scale=self.scaling, key_padding_mask=padding)
    elif sparse and selects:
        topk_indices = indexer_topk(
            queries.q, queries.weights, keys, cfg.index_topk, key_padding_mask=padding
        )
    if loss:
        handle.losses[self.layer_idx] = indexer_kl_loss_chunked(
            qt,
            kt,
            queries.q,
            queries.weights,
            keys,
            scale=self.scaling,
            # a forced selection is the loss's set also where it spans every visible key
            topk_indices=topk_indices if forced_cols is None else forced_cols,
            key_padding_mask=padding,
            query_rows=handle.loss_query_rows,
        )
    if observe and handle.observer is not None:
        handle.observer(
            LayerView(
                layer_idx=self.layer_idx,
                indexer=indexer,
                hidden=x,
                cos=icos,
                sin=isin,
                q=qt,
                k=kt,
                scale=self.scaling,
                topk_indices=topk_indices,
                key_padding_mask=padding,
            )
        )
    return topk_indices


def _record(self, handle: DSAHandle, p: _Projected, attention_mask, topk_indices) -> None:
    """Keep Indexing: this layer's selection as row positions ``[B, T, k]`` (:mod:`dsv32.dsa.keep`)
    into ``handle.recorded`` (every visible key where the layer ran dense)."""
    cfg = handle.config
    if cfg.mode != "sparse":
        raise IndexingError(
            f"layer {self.layer_idx}: Keep Indexing records selections in sparse mode; DSA is in "
            f"{cfg.mode!r} mode (handle.set_mode('sparse'))"
        )
    B, _, T, _ = p.q.shape
    S = p.k.shape[2]
    padding = _key_padding(attention_mask, S)
    positions = key_positions(padding, B, S, p.q.device)
    if topk_indices is None:
        real = None if padding is None else padding[:, S - T :]
        handle.recorded[self.layer_idx] = dense_positions(positions[:, S - T :], real, cfg.index_topk)
    else:
        handle.recorded[self.layer_idx] = pad_slots(to_positions(topk_indices, positions), cfg.index_topk)


def _dense_output(self, handle: DSAHandle, p: _Projected, attention_mask, **kwargs):
    """The model's own attention function: identical to the original forward."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    modeling = sys.modules[type(self).__module__]
    interface = ALL_ATTENTION_FUNCTIONS.get_interface(
        self.config._attn_implementation, modeling.eager_attention_forward
    )
    extra = {}
    if hasattr(self, "sliding_window"):
        extra["sliding_window"] = self.sliding_window
    elif handle.model_type == "mistral":
        extra["sliding_window"] = getattr(self.config, "sliding_window", None)
    out, weights = interface(
        self,
        p.q,
        p.k,
        p.v,
        attention_mask,
        dropout=0.0 if not self.training else self.attention_dropout,
        scaling=self.scaling,
        **extra,
        **kwargs,
    )
    B, _, T, _ = p.q.shape
    return self.o_proj(out.reshape(B, T, -1).contiguous()), weights


def _sparse_output(self, handle: DSAHandle, p: _Projected, topk_indices: torch.Tensor) -> torch.Tensor:
    """Attention over the selection (Eq. 2): gathered, or the masked-dense reference where that is
    faster (short sequences; in training, with autograd, up to a larger length, see
    :func:`~dsv32.dsa.prefer_dense`) or asked for."""
    cfg = handle.config
    B, _, T, _ = p.q.shape
    S = p.k.shape[2]
    qt, kt, vt = p.q.transpose(1, 2), p.k.transpose(1, 2), p.v.transpose(1, 2)  # [B, T|S, heads, D]
    training = torch.is_grad_enabled() and any(t.requires_grad for t in (qt, kt, vt))
    masked = cfg.sparse_impl == "masked" or (
        cfg.sparse_impl == "auto"
        and p.fresh
        and prefer_dense(
            T, S, cfg.index_topk, gqa_kernel=gqa_kernel_would_run(qt, kt, vt), training=training, batch=B
        )
    )
    if masked:  # the readable O(T·S) reference: dense scores masked to the selection
        out = dense_attention(qt, kt, vt, self.scaling, nonempty_rows(selection_mask(topk_indices, S)))
    else:
        out = sparse_attention(qt, kt, vt, topk_indices, self.scaling)
    return self.o_proj(out.reshape(B, T, -1))


def _key_padding(attention_mask, S: int) -> torch.Tensor | None:
    """``[B, S]`` True for real keys, read from the layer's 4-D mask (its last query row sees every
    earlier real key); None when there is no padding or the mask is not a plain tensor."""
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 4:
        return None
    row = attention_mask[:, 0, -1, :S]
    real = row if row.dtype == torch.bool else row == 0
    return None if bool(real.all()) else real


def _index_keys(attn, cache, new_keys: torch.Tensor, S: int) -> torch.Tensor:
    """All ``S`` index keys: those of earlier tokens are kept on the cache object beside its K/V."""
    if cache is None:
        return new_keys
    store = cache.__dict__.setdefault(INDEX_KEYS_ATTR, {})
    T = new_keys.shape[1]
    prev = None if S == T else store.get(attn.layer_idx)
    if S != T and prev is None:
        raise DSAError(
            f"layer {attn.layer_idx}: the KV cache holds {S - T} earlier tokens but no indexer keys; "
            "fill the cache with DSA attached in sparse mode (dense and off modes keep no indexer keys)"
        )
    if prev is not None and prev.shape[1] != S - T:
        raise DSAError(
            f"layer {attn.layer_idx}: {prev.shape[1]} cached indexer keys for {S - T} cached tokens "
            "(a cache cut back with crop() alone keeps them: cut both with "
            "dsv32.engine.backends.crop_hf_cache; beam search, which reorders caches, is not supported)"
        )
    if torch.is_grad_enabled():  # autograd may save the keys it scores: they must never change
        keys = new_keys if prev is None else torch.cat((prev, new_keys), dim=1)
        store[attn.layer_idx] = keys.detach()
        return keys
    # appended in place: a decode step writes its one key instead of copying all S (see GrowingTensor)
    growth = cache.__dict__.setdefault(_GROWTH_ATTR, {})
    keys = growth.setdefault(attn.layer_idx, GrowingTensor(1)).extend(prev, new_keys)
    store[attn.layer_idx] = keys
    return keys


def cut_index_keys(cache, keep: int) -> None:
    """Cut the indexer keys kept on ``cache`` back to their first ``keep`` tokens."""
    store = cache.__dict__.get(INDEX_KEYS_ATTR, {})
    growth = cache.__dict__.get(_GROWTH_ATTR, {})
    for layer, keys in store.items():
        store[layer] = growth[layer].cut(keys, keep) if layer in growth else keys[:, :keep]
