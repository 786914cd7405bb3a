"""Saving a converted model (indexers + DSA config, optionally the base weights) and loading it back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from dsv32.dsa.hf.attach import attach_dsa, detach_dsa
from dsv32.dsa.hf.config import CONFIG_FILE, WEIGHTS_FILE, DSAConfig, DSAError
from dsv32.dsa.hf.handle import get_dsa


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
        "dsa": handle.config.to_dict(),
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
