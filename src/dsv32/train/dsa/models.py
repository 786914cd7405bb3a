"""Models for DSA training: loading them, and one interface over both kinds the trainer handles.

- **Hugging Face** dense models (Llama / Mistral / Qwen2 / Qwen3) with :func:`dsv32.dsa.attach_dsa`;
- the **native** :class:`dsv32.model.DeepseekV32` (MLA + lightning indexer built in).

:class:`DSAModel` hides the difference: mode switching (``dense`` warm-up / ``sparse``), collecting
the per-layer indexer losses, the indexer's parameters, LM forward, save.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from dsv32.dsa.hf import (
    CONFIG_FILE,
    DSAConfig,
    attach_dsa,
    get_dsa,
    load_dsa,
    read_dsa_config,
    save_dsa,
)
from dsv32.engine.models import is_native_checkpoint, load_hf, load_native, resolve_device, tiny_native_config
from dsv32.train.dsa.config import ModelSpec, TrainConfigError

logger = logging.getLogger(__name__)


@dataclass
class DSAModel:
    """A model the DSA trainer can run: ``kind`` is ``"hf"`` or ``"native"``; ``source`` says where it
    came from (written into saved stages so the next stage can find the base)."""

    model: nn.Module
    kind: str
    tokenizer: object | None = None
    source: str = ""
    base_source: str = ""  # the unchanged base weights' source (HF indexer-only saves point here)
    autocast_dtype: torch.dtype | None = None
    extra: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ DSA controls
    def set_mode(self, mode: str, topk: int | None = None) -> None:
        """``"dense"`` (warm-up), ``"sparse"`` (DSA) — or ``"off"`` for HF models (the original)."""
        if self.kind == "hf":
            handle = get_dsa(self.model)
            handle.set_mode(mode)
            if topk is not None:
                handle.set_topk(topk)
            return
        if mode == "off":
            mode = "dense"
        self.model.set_dsa_mode(mode)
        if topk is not None:
            for layer in self.model.model.layers:
                layer.self_attn.index_topk = topk

    @property
    def topk(self) -> int:
        if self.kind == "hf":
            return get_dsa(self.model).config.index_topk
        return self.model.model.layers[0].self_attn.index_topk

    def collect_losses(self, on: bool, query_rows: torch.Tensor | None = None) -> None:
        """Make every DSA layer compute its indexer loss in the next forwards (``query_rows``: the
        query subsample, HF models only)."""
        if self.kind == "hf":
            handle = get_dsa(self.model)
            handle.collect_loss = on
            handle.loss_query_rows = query_rows
            handle.losses.clear()
        else:
            for layer in self.model.model.layers:
                layer.self_attn.compute_indexer_loss = on
                layer.self_attn.indexer_loss = None

    def pop_losses(self) -> dict[int, torch.Tensor]:
        if self.kind == "hf":
            return get_dsa(self.model).pop_losses()
        out = {}
        for i, layer in enumerate(self.model.model.layers):
            if layer.self_attn.indexer_loss is not None:
                out[i] = layer.self_attn.indexer_loss
                layer.self_attn.indexer_loss = None
        return out

    def indexer_named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [(n, p) for n, p in self.model.named_parameters() if ".indexer." in n]

    def model_named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [(n, p) for n, p in self.model.named_parameters() if ".indexer." not in n]

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    # ------------------------------------------------------------------ forward
    def autocast(self):
        if self.autocast_dtype is None:
            return torch.autocast(self.device.type, enabled=False)
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def logits(self, input_ids: torch.Tensor, logits_to_keep: int = 0) -> torch.Tensor:
        with self.autocast():
            if self.kind == "hf":
                return self.model(input_ids, logits_to_keep=logits_to_keep, use_cache=False).logits
            return self.model(input_ids, logits_to_keep=logits_to_keep).logits

    def lm_loss_sum(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Summed next-token NLL over ``input_ids`` ``[B, T]`` and the number of predicted tokens."""
        return self.token_nll(input_ids, reduction="sum"), input_ids[:, 1:].numel()

    def token_nll(self, input_ids: torch.Tensor, reduction: str = "none") -> torch.Tensor:
        """Next-token NLL of ``input_ids`` ``[B, T]``: ``[B, T - 1]`` (``reduction="none"``; position
        ``t`` predicts token ``t + 1``) or summed (``"sum"``), in at least fp32."""
        logits = self.logits(input_ids)
        wide = torch.promote_types(logits.dtype, torch.float32)  # at least fp32 (an fp64 model stays fp64)
        nll = torch.nn.functional.cross_entropy(
            logits[:, :-1].to(wide).reshape(-1, logits.shape[-1]),
            input_ids[:, 1:].reshape(-1),
            reduction=reduction,
        )
        return nll if reduction == "sum" else nll.view(input_ids.shape[0], -1)

    # ------------------------------------------------------------------ save
    def save(self, path: str | Path, *, weights: bool) -> Path:
        """Write the model so :func:`load_dsa_model` restores it: HF — the indexers + DSA config, and the
        base weights when ``weights`` (else a pointer to ``base_source``); native — a checkpoint."""
        path = Path(path)
        if self.kind == "hf":
            save_dsa(
                self.model,
                path,
                save_base=weights,
                base_ref=None if weights else self.base_source,
                tokenizer=self.tokenizer if weights else None,
            )
        else:
            self.model.save_pretrained(path)
            if self.tokenizer is not None:
                self.tokenizer.save_pretrained(path)
        return path


def _dtype(name: str) -> torch.dtype:
    if name not in ("float32", "bfloat16"):
        raise TrainConfigError(f"model.dtype must be 'float32' or 'bfloat16', got {name!r}")
    return getattr(torch, name)


def load_dsa_model(spec: ModelSpec, dsa: DSAConfig | None = None) -> DSAModel:
    """Load ``spec.name`` (see :class:`~dsv32.train.dsa.config.ModelSpec`) in fp32 on ``spec.device``; HF
    models get DSA attached with ``dsa`` unless they were saved with it. With ``model.dtype =
    "bfloat16"`` forwards run under autocast."""
    device = resolve_device(spec.device)
    autocast = None if _dtype(spec.dtype) == torch.float32 else _dtype(spec.dtype)
    dsa = dsa or DSAConfig()
    name = spec.name
    path = Path(name)
    tokenizer = None
    base_source = name
    if name == "tiny-native":
        from dsv32.model import DeepseekV32

        torch.manual_seed(0)
        loaded = DSAModel(DeepseekV32(tiny_native_config(index_topk=dsa.index_topk)), "native", source=name)
        loaded.base_source = name
    elif (path / CONFIG_FILE).is_file():
        meta = read_dsa_config(path)
        base = meta.get("base")
        if base == ".":
            from transformers import AutoTokenizer

            model = load_dsa(path)
            tokenizer = (
                AutoTokenizer.from_pretrained(path) if (path / "tokenizer_config.json").is_file() else None
            )
        else:
            base_model, tokenizer = load_hf(base)
            model = load_dsa(path, base_model)
            base_source = base
        loaded = DSAModel(model, "hf", tokenizer, source=name, base_source=base_source)
    elif is_native_checkpoint(path):
        model, tokenizer = load_native(path)
        loaded = DSAModel(model, "native", tokenizer, source=name, base_source=name)
    else:
        model, tokenizer = load_hf(name)
        attach_dsa(model, config=dsa)
        loaded = DSAModel(model, "hf", tokenizer, source=name, base_source=name)
    loaded.model.to(device)
    loaded.autocast_dtype = autocast
    return loaded
