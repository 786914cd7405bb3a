"""Multi-head Latent Attention with DeepSeek Sparse Attention (paper §2.1, Fig. 2, Appendix A).

Per token, MLA compresses keys and values into one latent ``c = [kv_latent (kv_lora_rank) ; k_rope
(qk_rope_head_dim)]``; heads expand it with ``kv_b_proj``. Two equivalent ways to attend:

- **MHA mode** (training, prefill from an empty cache): expand ``c`` into per-head keys/values and run
  ordinary causal attention;
- **MQA mode** (decode, continuing a cache): absorb ``kv_b_proj`` into the query and output sides so
  every head attends directly over the shared latents ``c[s]``.

DSA: the lightning indexer scores every visible key and each query attends only to its top
``index_topk`` latents (Eq. 2), in MQA mode — the gathered latents are shared by all heads. When a
query can see at most ``index_topk`` keys, the selection is everything it sees, so dense causal
attention gives the identical result and is used instead. ``dsa_mode = "dense"`` turns selection off
(the dense model DSA is trained from, and the warm-up stage).

``sparse_impl`` picks how the selection is applied: ``"gather"`` reads only the selected latents,
O(T·k); ``"masked"`` is the readable reference — dense scores masked to the selection, O(T·S), what
transformers does — that tests and benchmarks compare against; ``"auto"`` (default) gathers except for
a prefill from an empty cache shorter than the measured crossover (``dsv32.dsa.prefer_dense``: fewer
than ``DENSE_CROSSOVER_RATIO · index_topk`` keys — ``MLA_KERNEL_CROSSOVER_RATIO`` when the CPU C
kernel runs the sparse side —, overridable per layer with ``dense_crossover_ratio``), where the
masked-dense path gives the identical result faster.
"""

from __future__ import annotations

import torch
from torch import nn

from dsv32.dsa import (
    LightningIndexer,
    apply_rotary,
    dense_attention,
    dense_mla_attention,
    fp8_indexer_keys,
    fp8_indexer_queries,
    indexer_kl_loss_chunked,
    indexer_topk,
    mla_kernel_would_run,
    nonempty_rows,
    prefer_dense,
    selection_mask,
    sparse_mla_attention_absorbed,
)
from dsv32.dsa.indexer import visible_mask
from dsv32.model.cache import KVCache
from dsv32.model.config import ModelConfig
from dsv32.model.layers import RMSNorm

DSA_MODES = ("sparse", "dense")


class MLA(nn.Module):
    """MLA + lightning indexer for one layer; submodule names are the HF checkpoint's."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = H = config.num_attention_heads
        self.qk_nope_head_dim = config.qk_nope_head_dim
        self.qk_rope_head_dim = config.qk_rope_head_dim
        self.v_head_dim = config.v_head_dim
        self.kv_lora_rank = config.kv_lora_rank
        self.index_topk = config.index_topk
        self.softmax_scale = config.softmax_scale
        self.dsa_mode = "sparse"
        self.sparse_impl = "auto"
        self.dense_crossover_ratio: float | None = None  # None: dsv32.dsa.DENSE_CROSSOVER_RATIO
        # None: the indexer scores in fp32; "ue8m0" / "float": as the released FP8 indexer (dsv32.dsa.fp8)
        self.indexer_fp8: str | None = None
        # Training (dsv32.train): when set, a cache-free forward stores the indexer's KL loss here —
        # Eq. 3 over all visible keys in "dense" mode, Eq. 4 over the selection in "sparse" mode.
        self.compute_indexer_loss = False
        self.indexer_loss: torch.Tensor | None = None
        qk_head_dim = config.qk_head_dim
        bias = config.attention_bias
        if config.q_lora_rank:
            self.q_a_proj = nn.Linear(config.hidden_size, config.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(config.q_lora_rank, config.rms_norm_eps)
            self.q_b_proj = nn.Linear(config.q_lora_rank, H * qk_head_dim, bias=False)
        else:
            self.q_proj = nn.Linear(config.hidden_size, H * qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(
            config.hidden_size, config.kv_lora_rank + config.qk_rope_head_dim, bias=bias
        )
        self.kv_a_layernorm = RMSNorm(config.kv_lora_rank, config.rms_norm_eps)
        self.kv_b_proj = nn.Linear(
            config.kv_lora_rank, H * (config.qk_nope_head_dim + config.v_head_dim), bias=False
        )
        self.o_proj = nn.Linear(H * config.v_head_dim, config.hidden_size, bias=bias)
        self.indexer = LightningIndexer(
            hidden_size=config.hidden_size,
            n_heads=config.index_n_heads,
            head_dim=config.index_head_dim,
            rope_head_dim=config.qk_rope_head_dim,
            q_input_dim=config.q_lora_rank or config.hidden_size,
        )

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        *,
        key_padding_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
        forced_topk: torch.Tensor | None = None,
        return_topk: bool = False,
    ):
        """``x`` ``[B, T, hidden]``; ``cos``/``sin`` ``[B, T, rope/2]`` at the tokens' positions;
        ``key_padding_mask`` ``[B, S]`` over all keys (cache + new, True = real token) or None.

        ``forced_topk`` ``[B, T, k]`` key columns (−1 empty) to attend to instead of the indexer's
        selection when the layer selects (Keep Indexing: the indexer still scores, for its loss);
        ``return_topk``: return ``(output, topk_indices)``, the selection attended to (None when
        every query saw at most ``index_topk`` keys and the layer ran dense)."""
        B, T, _ = x.shape
        H, nope, rope = self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim
        if hasattr(self, "q_a_proj"):
            q_input = self.q_a_layernorm(self.q_a_proj(x))
            q = self.q_b_proj(q_input)
        else:
            q_input = x
            q = self.q_proj(x)
        q_nope, q_rope = q.view(B, T, H, nope + rope).split([nope, rope], dim=-1)
        q_rope = apply_rotary(q_rope, cos.unsqueeze(2), sin.unsqueeze(2), interleaved=True)
        kv_latent, k_rope = self.kv_a_proj_with_mqa(x).split([self.kv_lora_rank, rope], dim=-1)
        kv_latent = self.kv_a_layernorm(kv_latent)
        k_rope = apply_rotary(k_rope, cos, sin, interleaved=True)

        # The indexer reads detached inputs: it learns only from its own KL loss (paper §2.1.1).
        x_idx, q_input_idx = x.detach(), q_input.detach()
        index_keys = self.indexer.project_keys(x_idx, cos, sin)
        # FP8 selection quantizes each key once, as it enters the cache (the reference caches its FP8
        # keys too); the KL loss below reads the unquantized keys of this (cache-free) call
        select_keys = index_keys
        if self.indexer_fp8 is not None:
            select_keys = fp8_indexer_keys(index_keys, self.indexer_fp8).to(index_keys.dtype)
        start = 0
        if cache is not None:
            start = cache.length
            kv_latent, k_rope, select_keys = cache.write(self.layer_idx, kv_latent, k_rope, select_keys)
        S = start + T

        topk_indices = forced = None if forced_topk is None else forced_topk.to(x.device, torch.long)
        loss = self.compute_indexer_loss and start == 0
        # The indexer's queries are projected whether or not this forward's length selects: under
        # FSDP each call gathers the indexer's shard, and every rank must make the same calls.
        selects = self.dsa_mode == "sparse" and forced is None
        iq = self.indexer.project_queries(x_idx, q_input_idx, cos, sin) if selects or loss else None
        if self.dsa_mode != "sparse" or self.index_topk >= S:
            topk_indices = None
        elif selects:
            q_sel, w_sel = iq.q, iq.weights
            if self.indexer_fp8 is not None:
                q_sel, w_sel = fp8_indexer_queries(q_sel, w_sel, self.indexer_fp8)
            topk_indices = indexer_topk(
                q_sel, w_sel, select_keys, self.index_topk, key_padding_mask=key_padding_mask
            )

        if loss:  # a forced selection is the loss's set also where it spans every visible key
            self.indexer_loss = self._indexer_kl_loss(
                q_nope, q_rope, kv_latent, k_rope, iq, index_keys,
                topk_indices if forced is None else forced, key_padding_mask,
            )  # fmt: skip

        gather = self.sparse_impl == "gather" or (
            self.sparse_impl == "auto"
            and not (
                start == 0
                and prefer_dense(
                    T, S, self.index_topk, self.dense_crossover_ratio, mla_kernel=mla_kernel_would_run(x)
                )
            )
        )
        if topk_indices is not None and gather:
            out = self._mqa(q_nope, q_rope, kv_latent, k_rope, topk_indices=topk_indices)
        else:
            if topk_indices is None:
                mask = _attention_mask(T, S, key_padding_mask, x.device)
            else:  # the masked-dense reference: O(T·S) scores, masked to the selection
                mask = nonempty_rows(selection_mask(topk_indices, S))
            attend = self._mha if start == 0 else self._mqa
            out = attend(q_nope, q_rope, kv_latent, k_rope, mask=mask)
        out = self.o_proj(out.reshape(B, T, H * self.v_head_dim))
        return (out, topk_indices) if return_topk else out

    def _indexer_kl_loss(self, q_nope, q_rope, kv_latent, k_rope, iq, index_keys, topk_indices, padding):
        """The indexer's KL loss against this layer's own attention (MHA form, a detached target): the
        indexer learns only from it, the main model never does (paper §2.1.1)."""
        B, T, H, _ = q_nope.shape
        with torch.no_grad():
            k_nope = self.kv_b_proj(kv_latent).view(B, T, H, -1)[..., : self.qk_nope_head_dim]
            q = torch.cat((q_nope, q_rope), dim=-1)
            k = torch.cat((k_nope, k_rope.unsqueeze(2).expand(B, T, H, -1)), dim=-1)
        return indexer_kl_loss_chunked(
            q, k, iq.q, iq.weights, index_keys, scale=self.softmax_scale, topk_indices=topk_indices,
            key_padding_mask=padding,
        )  # fmt: skip

    def _mha(self, q_nope, q_rope, kv_latent, k_rope, mask=None):
        """Expand the latents into per-head K/V and attend (MHA mode); ``mask`` ``[B, T, S]`` or
        None for plain causal."""
        B, T, H, _ = q_nope.shape
        k_nope, v = (
            self.kv_b_proj(kv_latent).view(B, T, H, -1).split([self.qk_nope_head_dim, self.v_head_dim], -1)
        )
        k = torch.cat((k_nope, k_rope.unsqueeze(2).expand(B, T, H, -1)), dim=-1)
        q = torch.cat((q_nope, q_rope), dim=-1)
        return dense_attention(q, k, v, self.softmax_scale, mask)

    def _mqa(self, q_nope, q_rope, kv_latent, k_rope, mask=None, topk_indices=None):
        """Attend over the shared latents with ``kv_b_proj`` absorbed (MQA mode): over the selected
        latents only when ``topk_indices`` is given, else densely under ``mask``."""
        H = q_nope.shape[2]
        w_kv_b = self.kv_b_proj.weight.view(H, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
        w_uk, w_uv = w_kv_b[:, : self.qk_nope_head_dim], w_kv_b[:, self.qk_nope_head_dim :]
        if topk_indices is not None:  # latents and rope keys stay where the cache holds them
            return sparse_mla_attention_absorbed(
                q_nope, q_rope, kv_latent, topk_indices, self.softmax_scale, w_uk, w_uv, k_rope=k_rope
            )
        q_latent = torch.einsum("bthd,hdc->bthc", q_nope, w_uk)
        q, kv = torch.cat((q_latent, q_rope), dim=-1), torch.cat((kv_latent, k_rope), dim=-1)
        latent_out = dense_mla_attention(q, kv, self.softmax_scale, self.kv_lora_rank, mask)
        return torch.einsum("bthc,hdc->bthd", latent_out, w_uv)


def _attention_mask(T: int, S: int, key_padding_mask: torch.Tensor | None, device) -> torch.Tensor | None:
    """Causal (end-aligned) mask ``[B, T, S]`` without padding keys; ``None`` when plainly causal."""
    if key_padding_mask is None:
        return None if T == S else visible_mask(T, S, device)
    return nonempty_rows(visible_mask(T, S, device, key_padding_mask))
