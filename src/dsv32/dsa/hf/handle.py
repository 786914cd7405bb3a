"""The DSA state of one converted model (:class:`DSAHandle`) and how to find it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from dsv32.dsa.hf.config import SUPPORTED_MODEL_TYPES, DSAConfig, DSAError
from dsv32.dsa.hf.layer import HFIndexer, LayerView


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
    # Keep Indexing (dsv32.dsa.keep): each forward's selections, by layer, when recording; and the
    # selections to force instead of the indexer's ({layer: [B, T, k] row positions}) or None
    record_topk: bool = False
    recorded: dict[int, torch.Tensor] = field(default_factory=dict)
    forced_topk: dict[int, torch.Tensor] | None = None

    @property
    def mode(self) -> str:
        return self.config.mode

    def set_mode(self, mode: str) -> None:
        """``"off"`` (the original model), ``"dense"`` (warm-up) or ``"sparse"`` (DSA)."""
        self.config = replace(self.config, mode=mode)  # DSAConfig checks it (DSAError)

    def set_topk(self, k: int) -> None:
        self.config = replace(self.config, index_topk=k)

    def indexers(self) -> dict[int, HFIndexer]:
        return {i: m.indexer for i, m in self.modules.items()}

    def indexer_parameters(self) -> list[nn.Parameter]:
        return [p for m in self.modules.values() for p in m.indexer.parameters()]

    def pop_losses(self) -> dict[int, torch.Tensor]:
        """The per-layer indexer losses of the last forward(s) (and forget them)."""
        out, self.losses = self.losses, {}
        return out

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

    def stacked_indexing(self) -> torch.Tensor:
        """The last forward's recorded selections ``[len(modules), B, T, k]`` (layers in order)."""
        missing = sorted(set(self.modules) - set(self.recorded))
        if missing:
            raise DSAError(f"no selection was recorded for DSA layers {missing}: record in sparse mode")
        return torch.stack([self.recorded[i] for i in sorted(self.modules)])

    @contextmanager
    def indexing(self, forced: torch.Tensor | None = None, record: bool = False) -> Iterator[DSAHandle]:
        """Within the block, forwards force ``forced`` ``[len(modules), B, T, k]`` (row positions, DSA
        layers in order) and/or record their selections (:meth:`stacked_indexing`)."""
        if forced is not None and forced.shape[0] != len(self.modules):
            raise DSAError(
                f"indexing holds {forced.shape[0]} layers' selections; DSA is on {len(self.modules)} layers"
            )
        old = self.forced_topk, self.record_topk
        self.forced_topk = None if forced is None else dict(zip(sorted(self.modules), forced.unbind(0)))
        self.record_topk = record
        self.recorded = {}
        try:
            yield self
        finally:
            self.forced_topk, self.record_topk = old

    @contextmanager
    def observing(self, observer: Callable[[LayerView], None]) -> Iterator[DSAHandle]:
        old, self.observer = self.observer, observer
        try:
            yield self
        finally:
            self.observer = old


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    base = getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise DSAError(f"{type(model).__name__} has no .model.layers: not a decoder-only HF model")
    return layers


def model_type_of(model: nn.Module) -> str:
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


def sparse_dsa(model: nn.Module) -> bool:
    """Whether ``model`` selects with DSA: an HF model with DSA attached in sparse mode, or a model
    whose attention modules (``model.model.layers[i].self_attn``, the native V3.2 layout) are all in
    sparse mode."""
    if has_dsa(model):
        return get_dsa(model).mode == "sparse"
    layers = getattr(getattr(model, "model", None), "layers", None)
    modes = [getattr(getattr(layer, "self_attn", None), "dsa_mode", None) for layer in layers or []]
    return bool(modes) and all(m == "sparse" for m in modes)
