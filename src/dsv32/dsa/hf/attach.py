"""Attaching DSA to a Hugging Face model and taking it off again."""

from __future__ import annotations

import logging

import torch
from torch import nn

from dsv32.dsa.hf.config import DSAConfig, DSAError
from dsv32.dsa.hf.forward import dsa_forward
from dsv32.dsa.hf.handle import DSAHandle, decoder_layers, get_dsa, has_dsa, model_type_of
from dsv32.dsa.hf.layer import HFIndexer

logger = logging.getLogger(__name__)


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
    model_type = model_type_of(model)
    sizes = {"index_n_heads": index_n_heads, "index_head_dim": index_head_dim, "index_topk": index_topk}
    given = {name: value for name, value in sizes.items() if value is not None}
    cfg = DSAConfig.from_dict({**(config.to_dict() if config else {}), **given, **overrides})
    layers = decoder_layers(model)
    chosen = list(range(len(layers))) if cfg.layers is None else sorted(set(cfg.layers))
    if any(i >= len(layers) for i in chosen):  # DSAConfig refuses negative ones
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
        attn.forward = dsa_forward.__get__(attn)
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
