"""DeepSeek Sparse Attention on Hugging Face dense models (Llama / Mistral / Qwen2 / Qwen3 families).

:func:`attach_dsa` gives every chosen attention layer a lightning indexer (``self_attn.indexer``, the
V3.2 parameter names) and replaces the layer's ``forward`` by one that supports three modes:

- ``"off"`` — the original forward, untouched (the dense model);
- ``"dense"`` — dense attention through the model's own attention function (outputs identical to
  ``"off"``) while the indexer runs beside it: the warm-up stage (paper §2.1.1, Eq. 3);
- ``"sparse"`` — the indexer's top-k selection drives attention (Eq. 2) through
  :func:`~dsv32.dsa.sparse_attention` (GQA layout); a query that sees at most ``index_topk`` keys
  selects all of them, so such forwards take the dense path and are identical to ``"off"``.

The four families share one structure (``q_proj``/``k_proj``/``v_proj``/``o_proj``, RoPE applied by
the modeling module's ``apply_rotary_pos_emb`` from ``position_embeddings``; Qwen3 adds ``q_norm`` /
``k_norm``), so one replacement forward serves them all, calling the modeling module's own functions.
Sliding windows (Mistral, Qwen2/3 ``use_sliding_window``) are honoured in ``"dense"`` mode; ``"sparse"``
mode attends over the selection among *all* earlier keys.

The indexer (Eq. 1): ``q_I`` is a projection of the layer's (detached) input hidden state — these
models have no q LoRA — and ``k_I = LayerNorm(wk(h))``; the first ``index_rope_head_dim`` dims of both
get half-split RoPE with the model's own rotary angles (every m-th frequency when the indexer rotates
fewer dims than a head). Indexer parameters are kept in fp32 whatever the model dtype.

Training hooks: with ``handle.collect_loss`` each DSA layer stores its indexer KL loss (Eq. 3 in
``"dense"``, Eq. 4 over the selection in ``"sparse"``) in ``handle.losses``; ``handle.observer`` (a
callable) receives a :class:`LayerView` of every DSA layer in a cache-free forward — what the trainer
caches for the warm-up and the evaluator uses for attention recall.

Generation with a KV cache works in all modes: the indexer keys of past tokens are kept on the cache
object (greedy/sampling ``generate``; beam search, which reorders caches, is not supported).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn

from dsv32.dsa.attention import (
    SPARSE_IMPLS,
    dense_attention,
    nonempty_rows,
    prefer_dense,
    selection_mask,
    sparse_attention,
)
from dsv32.dsa.indexer import IndexerQueries, LightningIndexer, indexer_topk
from dsv32.dsa.loss import indexer_kl_loss_chunked, oracle_topk
from dsv32.errors import DSV32Error
from dsv32.recipe import Rule, at_least, each, one_of

logger = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
MODES = ("off", "dense", "sparse")
CONFIG_FILE = "dsa_config.json"
WEIGHTS_FILE = "dsa_indexer.safetensors"


class DSAError(DSV32Error, ValueError):
    """A model or checkpoint that DSA cannot be attached to or loaded into, or a bad DSA setting."""


@dataclass
class DSAConfig:
    """What :func:`attach_dsa` adds. Defaults of the released V3.2 where they transfer.

    Attributes:
        index_n_heads: indexer heads ``H_I`` (V3.2: 64).
        index_head_dim: indexer head dim ``D_I`` (V3.2: 128).
        index_topk: keys each query attends to in ``"sparse"`` mode (V3.2: 2048).
        index_rope_head_dim: leading dims of ``q_I``/``k_I`` with RoPE; default
            ``min(index_head_dim, model head_dim)``.
        layers: decoder layers that get DSA (default: all); the others stay dense.
        mode: initial mode, one of ``"off"``, ``"dense"``, ``"sparse"``.
        sparse_impl: ``"gather"`` (O(L·k)), ``"masked"`` (dense scores masked to the selection, the
            O(L²) reference) or ``"auto"`` (masked below the measured crossover, see
            :func:`~dsv32.dsa.prefer_dense`).
        seed: seed of the indexers' random initialization (layer i uses ``seed + i``).
    """

    RANGES: ClassVar[dict[str, Rule]] = {
        "index_n_heads": at_least(1),
        "index_head_dim": at_least(1),
        "index_topk": at_least(1),
        "index_rope_head_dim": at_least(0),
        "layers": each(at_least(0)),
        "mode": one_of(*MODES),
        "sparse_impl": one_of(*SPARSE_IMPLS),
    }

    index_n_heads: int = 4
    index_head_dim: int = 64
    index_topk: int = 256
    index_rope_head_dim: int | None = None
    layers: list[int] | None = None
    mode: str = "dense"
    sparse_impl: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise DSAError(f"DSA mode must be one of {MODES}, got {self.mode!r}")
        if self.sparse_impl not in SPARSE_IMPLS:
            raise DSAError(f"sparse_impl must be one of {SPARSE_IMPLS}, got {self.sparse_impl!r}")
        if min(self.index_n_heads, self.index_head_dim, self.index_topk) < 1:
            raise DSAError(
                f"index_n_heads, index_head_dim and index_topk must be >= 1, got {self.index_n_heads}, "
                f"{self.index_head_dim}, {self.index_topk}"
            )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> DSAConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise DSAError(f"unknown DSA config keys {sorted(unknown)}; known: {sorted(known)}")
        return cls(**data)


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
        """Eq. 3 (``topk_indices`` None) or Eq. 4 of this layer's indexer, differentiable w.r.t. it."""
        iq, ik = self.index_inputs()
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


@dataclass
class DSAHandle:
    """The DSA state of one model: config, the attention modules that carry an indexer, the mode, and
    the training hooks. Get it with :func:`get_dsa`."""

    config: DSAConfig
    model_type: str
    modules: dict[int, nn.Module]
    collect_loss: bool = False
    loss_query_rows: torch.Tensor | None = None  # optional subsample of query rows for the losses
    losses: dict[int, torch.Tensor] = field(default_factory=dict)
    observer: Callable[[LayerView], None] | None = None
    oracle: bool = False  # sparse mode selects the oracle top-k (evaluation: the indexer's upper bound)

    @property
    def mode(self) -> str:
        return self.config.mode

    def set_mode(self, mode: str) -> None:
        """``"off"`` (the original model), ``"dense"`` (warm-up) or ``"sparse"`` (DSA)."""
        if mode not in MODES:
            raise DSAError(f"DSA mode must be one of {MODES}, got {mode!r}")
        self.config.mode = mode

    def set_topk(self, k: int) -> None:
        if k < 1:
            raise DSAError(f"index_topk must be >= 1, got {k}")
        self.config.index_topk = k

    def indexers(self) -> dict[int, HFIndexer]:
        return {i: m.indexer for i, m in self.modules.items()}

    def indexer_parameters(self) -> list[nn.Parameter]:
        return [p for m in self.modules.values() for p in m.indexer.parameters()]

    def pop_losses(self) -> dict[int, torch.Tensor]:
        """The per-layer indexer losses of the last forward(s) (and forget them)."""
        out, self.losses = self.losses, {}
        return out

    @contextmanager
    def mode_as(self, mode: str, topk: int | None = None) -> Iterator[DSAHandle]:
        """Temporarily switch mode (and top-k)."""
        old_mode, old_k = self.config.mode, self.config.index_topk
        self.set_mode(mode)
        if topk is not None:
            self.set_topk(topk)
        try:
            yield self
        finally:
            self.config.mode, self.config.index_topk = old_mode, old_k

    @contextmanager
    def using_indexers(self, indexers: dict[int, HFIndexer]) -> Iterator[DSAHandle]:
        """Temporarily run with other indexers (e.g. :func:`random_indexers`, the untrained baseline)."""
        if set(indexers) != set(self.modules):
            raise DSAError(
                f"indexers for layers {sorted(indexers)} but DSA is on layers {sorted(self.modules)}"
            )
        old = {i: m._modules["indexer"] for i, m in self.modules.items()}
        try:
            for i, m in self.modules.items():
                m._modules["indexer"] = indexers[i]
            yield self
        finally:
            for i, m in self.modules.items():
                m._modules["indexer"] = old[i]

    @contextmanager
    def selecting_oracle(self) -> Iterator[DSAHandle]:
        """Temporarily let sparse mode attend to the oracle top-k — the keys with the largest
        head-summed dense attention — instead of the indexer's: what a perfect indexer would give.
        Evaluation only (it computes the dense attention of every layer, O(T·S))."""
        old, self.oracle = self.oracle, True
        try:
            yield self
        finally:
            self.oracle = old

    @contextmanager
    def observing(self, observer: Callable[[LayerView], None]) -> Iterator[DSAHandle]:
        old, self.observer = self.observer, observer
        try:
            yield self
        finally:
            self.observer = old


def _decoder_layers(model: nn.Module) -> nn.ModuleList:
    base = getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise DSAError(f"{type(model).__name__} has no .model.layers: not a decoder-only HF model")
    return layers


def _model_type(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise DSAError(
            f"attach_dsa supports the {SUPPORTED_MODEL_TYPES} attention families; this model is "
            f"{model_type!r} ({type(model).__name__})"
        )
    return model_type


def get_dsa(model: nn.Module) -> DSAHandle:
    """The :class:`DSAHandle` of a model that :func:`attach_dsa` converted."""
    handle = model.__dict__.get("_dsa_handle")
    if handle is None:
        raise DSAError(f"{type(model).__name__} has no DSA attached: call attach_dsa(model, ...) first")
    return handle


def has_dsa(model: nn.Module) -> bool:
    return "_dsa_handle" in model.__dict__


def attach_dsa(
    model: nn.Module,
    index_n_heads: int | None = None,
    index_head_dim: int | None = None,
    index_topk: int | None = None,
    *,
    config: DSAConfig | None = None,
    **overrides,
) -> DSAHandle:
    """Convert a Llama / Mistral / Qwen2 / Qwen3 ``*ForCausalLM`` (in place) to DSA.

    Pass the indexer size directly (``attach_dsa(model, 4, 64, 256)``) or a :class:`DSAConfig`; other
    :class:`DSAConfig` fields go in ``overrides`` (``layers=[...]``, ``mode="sparse"``, ...). New
    indexers are randomly initialized (seeded) in fp32 on the model's device. Returns the handle (also
    :func:`get_dsa(model) <get_dsa>`); :func:`detach_dsa` restores the original model.
    """
    if has_dsa(model):
        raise DSAError("this model already has DSA attached (detach_dsa(model) first)")
    model_type = _model_type(model)
    cfg = DSAConfig(**(config.to_dict() if config else {}))
    for name, value in (
        ("index_n_heads", index_n_heads),
        ("index_head_dim", index_head_dim),
        ("index_topk", index_topk),
    ):
        if value is not None:
            setattr(cfg, name, value)
    cfg = DSAConfig.from_dict({**cfg.to_dict(), **overrides})
    layers = _decoder_layers(model)
    chosen = list(range(len(layers))) if cfg.layers is None else sorted(set(cfg.layers))
    if any(i < 0 or i >= len(layers) for i in chosen):
        raise DSAError(f"layers {chosen} out of range for a model with {len(layers)} layers")
    cfg.layers = None if cfg.layers is None else chosen
    hidden_size = model.config.hidden_size
    param = next(model.parameters())
    modules: dict[int, nn.Module] = {}
    for i in chosen:
        attn = layers[i].self_attn
        for name in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling"):
            if not hasattr(attn, name):
                raise DSAError(
                    f"layer {i}: {type(attn).__name__} has no {name!r}: unsupported attention module"
                )
        attn.indexer = _new_indexer(cfg, attn, hidden_size, cfg.seed + i, param.device)
        modules[i] = attn
        window = getattr(attn, "sliding_window", None) or (
            getattr(model.config, "sliding_window", None) if model_type == "mistral" else None
        )
        if window:
            logger.warning(
                "layer %d has a sliding window (%s): DSA 'sparse' mode selects among all keys", i, window
            )
    handle = DSAHandle(config=cfg, model_type=model_type, modules=modules)
    for attn in modules.values():
        attn.__dict__["_dsa_handle"] = handle
        attn.forward = _dsa_forward.__get__(attn)
    model.__dict__["_dsa_handle"] = handle
    return handle


def _new_indexer(cfg: DSAConfig, attn: nn.Module, hidden_size: int, seed: int, device) -> HFIndexer:
    rope = cfg.index_rope_head_dim
    if rope is None:
        rope = min(cfg.index_head_dim, attn.head_dim)
    if rope > attn.head_dim:
        raise DSAError(f"index_rope_head_dim={rope} exceeds the model's head_dim={attn.head_dim}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        indexer = HFIndexer(hidden_size, cfg.index_n_heads, cfg.index_head_dim, rope, attn.head_dim)
    return indexer.to(device=device, dtype=torch.float32)


def random_indexers(model: nn.Module, seed: int | None = None) -> dict[int, HFIndexer]:
    """Freshly initialized indexers for every DSA layer of ``model`` — what :func:`attach_dsa` starts
    from (same seeds unless ``seed`` is given): the untrained baseline."""
    handle = get_dsa(model)
    base = handle.config.seed if seed is None else seed
    hidden_size = model.config.hidden_size
    return {
        i: _new_indexer(handle.config, attn, hidden_size, base + i, attn.indexer.wk.weight.device)
        for i, attn in handle.modules.items()
    }


def detach_dsa(model: nn.Module) -> None:
    """Remove the indexers and restore the original attention forwards."""
    handle = get_dsa(model)
    for attn in handle.modules.values():
        del attn.forward
        del attn.indexer
        attn.__dict__.pop("_dsa_handle", None)
    del model.__dict__["_dsa_handle"]


# ---------------------------------------------------------------------------------------------- forward


def _key_padding(attention_mask, S: int) -> torch.Tensor | None:
    """``[B, S]`` True for real keys, read from the layer's 4-D mask (its last query row sees every
    earlier real key); None when there is no padding or the mask is not a plain tensor."""
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 4:
        return None
    row = attention_mask[:, 0, -1, :S]
    real = row if row.dtype == torch.bool else row == 0
    return None if bool(real.all()) else real


def _index_keys(attn, past_key_values, new_keys: torch.Tensor, S: int) -> torch.Tensor:
    """All ``S`` index keys: those of earlier tokens are kept on the cache object beside its K/V."""
    if past_key_values is None:
        return new_keys
    store = past_key_values.__dict__.setdefault("_dsa_index_keys", {})
    T = new_keys.shape[1]
    prev = store.get(attn.layer_idx)
    if S == T or prev is None:
        if S != T:
            raise DSAError(
                f"layer {attn.layer_idx}: the KV cache holds {S - T} earlier tokens but no indexer keys; "
                "fill the cache with the DSA model attached"
            )
        keys = new_keys
    else:
        if prev.shape[1] != S - T:
            raise DSAError(
                f"layer {attn.layer_idx}: {prev.shape[1]} cached indexer keys for {S - T} cached tokens "
                "(was the cache cropped or reordered? beam search is not supported)"
            )
        keys = torch.cat((prev, new_keys.detach()), dim=1)
    store[attn.layer_idx] = keys.detach()
    return keys


def _dsa_forward(
    self,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    attention_mask: torch.Tensor | None = None,
    past_key_values=None,
    **kwargs,
):
    """Replacement ``forward`` of a Llama-family attention module (see the module docstring)."""
    handle: DSAHandle = self.__dict__["_dsa_handle"]
    cfg = handle.config
    original = type(self).forward
    if cfg.mode == "off":
        return original(self, hidden_states, position_embeddings, attention_mask, past_key_values, **kwargs)
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

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
    if past_key_values is not None:
        k, v = past_key_values.update(k, v, self.layer_idx)
    S = k.shape[2]
    fresh = S == T  # no cached prefix: the losses and the observer see whole sequences

    sparse = cfg.mode == "sparse" and cfg.index_topk < S
    needs_index = sparse or (fresh and (handle.collect_loss or handle.observer is not None))
    keep_keys = cfg.mode == "sparse" and past_key_values is not None
    topk_indices = None
    if needs_index or keep_keys:
        indexer: HFIndexer = self.indexer
        # The indexer reads detached inputs: it learns only from its own KL loss (paper §2.1.1).
        x = hidden_states.detach().to(indexer.inputs_dtype())
        icos, isin = indexer.rope_angles(cos, sin)
        keys = _index_keys(
            self, past_key_values if keep_keys else None, indexer.project_keys(x, icos, isin), S
        )
        padding = _key_padding(attention_mask, S)
        if needs_index:
            queries = indexer.project_queries(x, x, icos, isin)
        if sparse and handle.oracle:
            topk_indices = oracle_topk(
                q.transpose(1, 2),
                k.transpose(1, 2),
                cfg.index_topk,
                scale=self.scaling,
                key_padding_mask=padding,
            )
        elif sparse:
            topk_indices = indexer_topk(
                queries.q, queries.weights, keys, cfg.index_topk, key_padding_mask=padding
            )
        if fresh and handle.collect_loss:
            handle.losses[self.layer_idx] = indexer_kl_loss_chunked(
                q.transpose(1, 2).detach(),
                k.transpose(1, 2).detach(),
                queries.q,
                queries.weights,
                keys,
                scale=self.scaling,
                topk_indices=topk_indices,
                key_padding_mask=padding,
                query_rows=handle.loss_query_rows,
            )
        if fresh and handle.observer is not None:
            handle.observer(
                LayerView(
                    layer_idx=self.layer_idx,
                    indexer=indexer,
                    hidden=x,
                    cos=icos,
                    sin=isin,
                    q=q.transpose(1, 2).detach(),
                    k=k.transpose(1, 2).detach(),
                    scale=self.scaling,
                    topk_indices=topk_indices,
                    key_padding_mask=padding,
                )
            )

    if topk_indices is None:  # dense: the model's own attention function (identical to "off")
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
            q,
            k,
            v,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            **extra,
            **kwargs,
        )
        out = out.reshape(B, T, -1).contiguous()
        return self.o_proj(out), weights

    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, T|S, heads, D] views
    masked = cfg.sparse_impl == "masked" or (
        cfg.sparse_impl == "auto" and fresh and prefer_dense(T, S, cfg.index_topk)
    )
    if masked:  # the readable O(T·S) reference: dense scores masked to the selection
        out = dense_attention(qt, kt, vt, self.scaling, nonempty_rows(selection_mask(topk_indices, S)))
    else:
        out = sparse_attention(qt, kt, vt, topk_indices, self.scaling)
    return self.o_proj(out.reshape(B, T, -1)), None


# --------------------------------------------------------------------------------------------- save/load


def indexer_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The indexer weights under the model's own names (``model.layers.{i}.self_attn.indexer.*``)."""
    get_dsa(model)
    return {n: p.detach() for n, p in model.named_parameters() if ".indexer." in n} | {
        n: b.detach() for n, b in model.named_buffers() if ".indexer." in n
    }


@contextmanager
def without_indexers(model: nn.Module) -> Iterator[nn.Module]:
    """Temporarily take the indexer submodules out (to save or compare the base model alone)."""
    handle = get_dsa(model)
    taken = {i: m._modules.pop("indexer") for i, m in handle.modules.items()}
    try:
        yield model
    finally:
        for i, m in handle.modules.items():
            m._modules["indexer"] = taken[i]


def save_dsa(
    model: nn.Module, path: str | Path, *, save_base: bool = True, base_ref: str | None = None, tokenizer=None
) -> Path:
    """Write a converted model to ``path``: ``dsa_indexer.safetensors`` (the indexers) and
    ``dsa_config.json`` (the :class:`DSAConfig`, the model type, and ``base`` — where the base weights
    are), plus — with ``save_base`` — the base model itself via ``save_pretrained`` (what the sparse
    stage changed). Without ``save_base``, ``base_ref`` names the unchanged base (e.g. a hub id or
    directory) for :func:`load_dsa`."""
    from safetensors.torch import save_file

    handle = get_dsa(model)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {n: t.contiguous().cpu() for n, t in indexer_state_dict(model).items()}
    save_file(tensors, str(path / WEIGHTS_FILE), metadata={"format": "pt"})
    if save_base:
        with without_indexers(model):
            model.save_pretrained(path)
        if tokenizer is not None:
            tokenizer.save_pretrained(path)
    meta = {
        "dsa": {**handle.config.to_dict(), "mode": handle.config.mode},
        "model_type": handle.model_type,
        "base": "." if save_base else base_ref,
    }
    (path / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return path


def read_dsa_config(path: str | Path) -> dict:
    """The ``dsa_config.json`` of a saved DSA model (``{"dsa": {...}, "model_type": ..., "base": ...}``)."""
    file = Path(path) / CONFIG_FILE
    if not file.is_file():
        raise DSAError(f"{path} is not a saved DSA model (no {CONFIG_FILE})")
    return json.loads(file.read_text())


def load_dsa(
    path: str | Path, model: nn.Module | None = None, *, dtype: torch.dtype = torch.float32, **kwargs
) -> nn.Module:
    """Load a model saved by :func:`save_dsa`: into ``model`` (a fresh HF model of the same base), or —
    when the directory holds the base weights — a new ``AutoModelForCausalLM`` from ``path``. Attaches
    DSA with the saved config and loads the indexers (every one must be present)."""
    from safetensors.torch import load_file

    path = Path(path)
    meta = read_dsa_config(path)
    if model is None:
        if meta.get("base") != ".":
            raise DSAError(
                f"{path} holds only the indexers (base: {meta.get('base')!r}); load that base model and "
                "pass it as load_dsa(path, model)"
            )
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs)
    if model.config.model_type != meta["model_type"]:
        raise DSAError(
            f"{path} was saved from a {meta['model_type']!r} model, not {model.config.model_type!r}"
        )
    attach_dsa(model, config=DSAConfig.from_dict(meta["dsa"]))
    state = load_file(str(path / WEIGHTS_FILE))
    own = indexer_state_dict(model)
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        detach_dsa(model)
        raise DSAError(
            f"indexer weights do not match the model: missing {missing[:4]}, unexpected {unexpected[:4]}"
        )
    params = dict(model.named_parameters()) | dict(model.named_buffers())
    with torch.no_grad():
        for name, tensor in state.items():
            if params[name].shape != tensor.shape:
                detach_dsa(model)
                raise DSAError(f"{name}: saved shape {tuple(tensor.shape)} != {tuple(params[name].shape)}")
            params[name].copy_(tensor)
    return model
