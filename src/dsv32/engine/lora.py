"""LoRA adapters (peft) on any model the trainers load, in place.

A recipe's ``[lora]`` section (:class:`LoRAConfig`; off by default) is applied once when a trainer is
built (:func:`apply_lora`): peft injects ``lora_A``/``lora_B`` into the named linear layers of the
model object itself (``inject_adapter_in_model``, no wrapper: every caller keeps the same model) and
every other parameter is frozen, so only the adapter trains and goes to the optimizer.

- the base model is the model with its adapter switched off (:func:`adapter_disabled`): GRPO's
  frozen reference for the KL term, exactly, with no second copy of the weights;
- :func:`adapter_state` / :func:`load_adapter_state`: the adapter's tensors by parameter name (what
  an engine that holds the same base model needs to sample with the trained policy);
- :func:`save_adapter`: the adapter in peft's save format (``adapter_config.json`` and
  ``adapter_model.safetensors``), loadable by ``PeftModel.from_pretrained(base, path)``;
- :func:`merged_copy`: a copy of the model with the adapter folded into the base weights and the
  LoRA layers removed (the full weights, for ``model/`` or an engine without adapters).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn

from dsv32.errors import DSV32Error
from dsv32.recipe import POSITIVE, Checked, RecipeError, Rule, at_least, in_range

#: The adapter's name inside peft's layers (one adapter per model).
ADAPTER = "default"
#: Where peft's save format puts the model's names (``PeftModel`` wraps ``base_model.model``).
PEFT_PREFIX = "base_model.model."


class LoRAError(DSV32Error, ValueError):
    """A ``[lora]`` section that does not fit the model, or adapter tensors that do not fit it."""


class LoRAConfigError(RecipeError):
    """A ``[lora]`` section whose values are out of range."""


@dataclass
class LoRAConfig(Checked, error=LoRAConfigError):
    """``[lora]``: train a rank-``r`` adapter instead of the full weights.

    - ``enabled``: off by default (full fine-tuning);
    - ``r`` rank, ``alpha`` scale (the update is ``alpha / r · B A``), ``dropout`` on the adapter's input;
    - ``target_modules``: module names (the last part of a dotted name, ``q_proj``, or a full one);
      empty: every linear layer except the output head and the DSA indexer's.
    """

    RANGES: ClassVar[dict[str, Rule]] = {
        "r": at_least(1),
        "alpha": POSITIVE,
        "dropout": in_range(0.0, 1.0),
        "target_modules": Rule(lambda v: all(isinstance(x, str) and x for x in v), "names of modules"),
    }

    enabled: bool = False
    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=list)


def _head(model: nn.Module) -> nn.Module | None:
    get = getattr(model, "get_output_embeddings", None)
    return get() if callable(get) else getattr(model, "lm_head", None)


def target_names(model: nn.Module, cfg: LoRAConfig) -> list[str]:
    """The full names of the modules ``cfg`` puts an adapter on; :class:`LoRAError` for a name in
    ``target_modules`` that no linear layer of ``model`` has."""
    head = _head(model)
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) and m is not head and n}
    if not cfg.target_modules:
        return [n for n in linears if ".indexer." not in f".{n}."]
    chosen, unknown = [], []
    for want in cfg.target_modules:
        hits = [n for n in linears if n == want or n.endswith(f".{want}")]
        if not hits:
            unknown.append(want)
        chosen += [n for n in hits if n not in chosen]
    if unknown:
        kinds = sorted({n.rsplit(".", 1)[-1] for n in linears})
        raise LoRAError(
            f"[lora] target_modules names {unknown}, which {type(model).__name__} has no linear layer "
            f"called; its linear layers are {kinds}"
        )
    return chosen


def apply_lora(model: nn.Module, cfg: LoRAConfig, seed: int | None = None) -> nn.Module:
    """Inject ``cfg``'s adapter into ``model`` in place and freeze everything else (``model``
    returned). peft initializes it (``lora_B`` zero: the adapted model starts equal to the base);
    ``seed``: ``lora_A`` is drawn from a generator seeded with it, the global RNG left as it was
    (None: from the global RNG)."""
    if seed is not None:
        devices = [model_device(model)] if model_device(model).type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            return apply_lora(model, cfg)
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError as err:
        raise LoRAError("[lora] needs peft: pip install 'dsv32[lora]'") from err
    if has_adapter(model):
        raise LoRAError("the model already holds a LoRA adapter")
    names = target_names(model, cfg)
    peft_cfg = LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=names)
    model.requires_grad_(False)
    inject_adapter_in_model(peft_cfg, model, adapter_name=ADAPTER)
    model.peft_config = {ADAPTER: peft_cfg}  # what save_adapter writes as adapter_config.json
    for n, p in model.named_parameters():
        p.requires_grad_(is_adapter_parameter(n))
    return model


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def is_adapter_parameter(name: str) -> bool:
    return ".lora_" in name or name.startswith("lora_")


def _lora_layers(model: nn.Module) -> list[nn.Module]:
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]


def has_adapter(model: nn.Module) -> bool:
    return any(is_adapter_parameter(n) for n, _ in model.named_parameters())


@contextmanager
def adapter_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block ``model`` computes its base model: every LoRA layer returns its base layer's
    output exactly (peft skips the adapter's branch)."""
    layers = _lora_layers(model)
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's tensors by ``model``'s parameter names (detached, on their device)."""
    return {n: p.detach() for n, p in model.named_parameters() if is_adapter_parameter(n)}


def load_adapter_state(model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Copy ``tensors`` (:func:`adapter_state` of a model with the same adapter) into ``model``'s
    adapter; :class:`LoRAError`, changing nothing, when names or shapes do not match."""
    params = dict(adapter_state(model))
    missing = sorted(set(params) - set(tensors))
    unexpected = sorted(set(tensors) - set(params))
    shapes = [n for n, t in tensors.items() if n in params and tuple(t.shape) != tuple(params[n].shape)]
    if missing or unexpected or shapes:
        why = f"shape of {shapes[:3]}" if shapes else f"missing {missing[:3]}, unexpected {unexpected[:3]}"
        raise LoRAError(f"the adapter's tensors do not fit the model's adapter ({why})")
    with torch.no_grad():
        for n, t in tensors.items():
            params[n].copy_(t)


def save_adapter(model: nn.Module, path: str | Path, base: str = "") -> Path:
    """The adapter in peft's save format under ``path`` (``base``: the base model's name or
    directory, recorded as ``base_model_name_or_path``)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = copy.copy(model.peft_config[ADAPTER])
    cfg.base_model_name_or_path = base or None
    cfg.save_pretrained(str(path))
    tensors = {
        PEFT_PREFIX + n.replace(f".{ADAPTER}.", "."): t.contiguous().cpu()
        for n, t in adapter_state(model).items()
    }
    save_file(tensors, str(path / "adapter_model.safetensors"), metadata={"format": "pt"})
    return path


def merged_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose adapted layers hold ``W + alpha / r · B A`` and no adapter: the
    weights an engine without adapters samples the trained policy with."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    merged = copy.deepcopy(model)
    for name, module in list(merged.named_modules()):
        if isinstance(module, BaseTunerLayer):
            module.merge(adapter_names=[ADAPTER])
            parent_name, _, child = name.rpartition(".")
            parent = merged.get_submodule(parent_name) if parent_name else merged
            setattr(parent, child, module.get_base_layer())
    if hasattr(merged, "peft_config"):
        del merged.peft_config
    return merged
