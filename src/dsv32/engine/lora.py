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
  LoRA layers removed (the full weights, for ``model/`` or an engine without adapters);
- :func:`read_adapter` and :class:`MergedAdapters`: what an engine that holds the base model alone
  does with an adapter in peft's save format (``dsv32 serve``'s ``/update_adapter``): every adapted
  linear layer's weight set to ``W₀ + scale · B A`` from a kept copy of its base weight ``W₀``.
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
#: peft's file names in an adapter directory.
ADAPTER_FILE, CONFIG_FILE = "adapter_model.safetensors", "adapter_config.json"
#: The safetensors metadata key of the weight version :func:`save_adapter` stamps.
VERSION_KEY = "weight_version"
#: An adapter file larger than this is refused unread (a rank-64 adapter of a 7B model is ~0.3 GB).
MAX_ADAPTER_BYTES = 8 << 30


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


def save_adapter(model: nn.Module, path: str | Path, base: str = "", version: int | None = None) -> Path:
    """The adapter in peft's save format under ``path`` (``base``: the base model's name or
    directory, recorded as ``base_model_name_or_path``; ``version``: a weight version stamped in the
    safetensors metadata as ``weight_version``, which :func:`read_adapter` reports)."""
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
    metadata = {"format": "pt"} | ({} if version is None else {VERSION_KEY: str(int(version))})
    tmp = path / f".{ADAPTER_FILE}.tmp"
    save_file(tensors, str(tmp), metadata=metadata)
    tmp.replace(path / ADAPTER_FILE)  # a reader never sees half a file
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


# ---------------------------------------------------------------------- an engine that holds the base model
@dataclass
class AdapterFile:
    """An adapter read from peft's save format: ``pairs`` maps a module name of the base model to
    its ``(A [r, in], B [out, r])``; the update of that module is ``scale · B A``; ``version`` the
    stamped weight version (None: none stamped)."""

    scale: float
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]]
    version: int | None


def _adapter_config(folder: Path) -> float:
    """The update's scale from ``adapter_config.json`` (α / r, α / √r with rsLoRA); a
    :class:`LoRAError` for a file that is not a plain LoRA adapter's config."""
    import json

    try:
        raw = json.loads((folder / CONFIG_FILE).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise LoRAError(f"{folder / CONFIG_FILE} cannot be read as JSON: {type(err).__name__}") from None
    if not isinstance(raw, dict) or raw.get("peft_type", "LORA") != "LORA":
        raise LoRAError(f"{folder / CONFIG_FILE} is not a LoRA adapter's config (peft_type LORA)")
    r, alpha = raw.get("r"), raw.get("lora_alpha")
    if not (isinstance(r, int) and r >= 1 and isinstance(alpha, int | float) and alpha > 0):
        raise LoRAError(f"{folder / CONFIG_FILE}: r must be a positive integer and lora_alpha positive")
    unsupported = [k for k in ("use_dora", "rank_pattern", "alpha_pattern", "fan_in_fan_out") if raw.get(k)]
    if unsupported:
        raise LoRAError(
            f"{folder / CONFIG_FILE}: {unsupported} are not supported (a plain LoRA adapter only)"
        )
    return alpha / (r**0.5 if raw.get("use_rslora") else r)


def read_adapter(path: str | Path) -> AdapterFile:
    """An adapter directory in peft's save format (:func:`save_adapter`'s): a :class:`LoRAError`
    naming what is wrong for a missing or unreadable file, a config that is not LoRA's, tensors that
    are not ``lora_A``/``lora_B`` pairs of matching rank."""
    import re

    from safetensors import SafetensorError, safe_open

    folder = Path(path)
    weights = folder / ADAPTER_FILE
    if not folder.is_dir() or not weights.is_file():
        raise LoRAError(f"{folder} is not an adapter directory (no {ADAPTER_FILE})")
    if weights.stat().st_size > MAX_ADAPTER_BYTES:
        raise LoRAError(f"{weights} is larger than {MAX_ADAPTER_BYTES >> 30} GiB")
    scale = _adapter_config(folder)
    found: dict[str, dict[str, torch.Tensor]] = {}
    try:
        with safe_open(str(weights), framework="pt") as f:
            metadata = f.metadata() or {}
            for key in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                m = re.fullmatch(r"(.+)\.lora_([AB])(?:\.default)?\.weight", key.removeprefix(PEFT_PREFIX))
                if m is None:
                    raise LoRAError(f"{weights}: {key!r} is not a lora_A / lora_B weight")
                found.setdefault(m.group(1), {})[m.group(2)] = f.get_tensor(key)
    except (SafetensorError, OSError, ValueError) as err:
        raise LoRAError(f"{weights} cannot be read as safetensors: {type(err).__name__}") from None
    pairs = {}
    for name, t in found.items():
        a, b = t.get("A"), t.get("B")
        if a is None or b is None or a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise LoRAError(f"{weights}: {name} needs a 2-D lora_A [r, in] and lora_B [out, r] of the same r")
        if not (a.is_floating_point() and b.is_floating_point()):
            raise LoRAError(f"{weights}: {name}'s tensors are not floating point")
        pairs[name] = (a, b)
    if not pairs:
        raise LoRAError(f"{weights} holds no adapter tensors")
    version = metadata.get(VERSION_KEY)
    if version is not None and not version.isdigit():
        raise LoRAError(f"{weights}: the stamped {VERSION_KEY} {version!r} is not a step number")
    return AdapterFile(scale=scale, pairs=pairs, version=None if version is None else int(version))


class MergedAdapters:
    """Applies adapters to ``model`` by merging: each adapted linear layer's weight becomes
    ``W₀ + scale · B A`` (computed in float32, stored in the weight's dtype), ``W₀`` a copy of its base
    weight kept from the first adapter that touched it; a layer the next adapter leaves out gets
    ``W₀`` back. :meth:`forget` after the base weights themselves change (a full weight load)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.base: dict[str, torch.Tensor] = {}

    def check(self, adapter: AdapterFile) -> dict[str, nn.Linear]:
        """The layers ``adapter`` adapts; a :class:`LoRAError` (nothing changed) when one is not a
        linear layer of the model or its tensors do not fit it."""
        modules = dict(self.model.named_modules())
        layers, wrong = {}, []
        for name, (a, b) in adapter.pairs.items():
            layer = modules.get(name)
            if not isinstance(layer, nn.Linear):
                wrong.append(f"{name} (not a linear layer of the model)")
            elif a.shape[1] != layer.in_features or b.shape[0] != layer.out_features:
                wrong.append(
                    f"{name} (lora_A {list(a.shape)}, lora_B {list(b.shape)} for a {layer.out_features}x{layer.in_features} layer)"
                )
            else:
                layers[name] = layer
        if wrong:
            raise LoRAError(f"the adapter does not fit the served model: {wrong[:3]}")
        return layers

    @torch.no_grad()
    def apply(self, adapter: AdapterFile) -> None:
        layers = self.check(adapter)
        modules = dict(self.model.named_modules())
        for name in [n for n in self.base if n not in layers]:
            modules[name].weight.copy_(self.base.pop(name))
        for name, layer in layers.items():
            w = layer.weight
            base = self.base.setdefault(name, w.detach().clone())
            a, b = (t.to(device=w.device, dtype=torch.float32) for t in adapter.pairs[name])
            w.copy_((base.float() + adapter.scale * (b @ a)).to(w.dtype))

    def forget(self) -> None:
        self.base.clear()
