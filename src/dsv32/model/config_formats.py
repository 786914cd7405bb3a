"""Reading the two config formats DeepSeek-V3.2 ships with into :class:`ModelConfig` field values.

- :func:`read_hf`: a Hugging Face ``config.json``, read as transformers' ``DeepseekV32Config`` reads it
  (its RoPE rules included: :func:`hf_rope`);
- :func:`read_reference`: the reference inference config of DeepSeek's ``inference/`` folder, with the
  reference ``ModelArgs`` defaults for what it leaves out.

Also the value checks that :meth:`ModelConfig.validate` shares with the readers. A malformed value
raises :class:`ConfigError` naming the field as the file spells it.
"""

from __future__ import annotations

import math
from typing import Any

from dsv32.errors import DSV32Error

# The released model's context length, transformers' default too.
MAX_POSITION_EMBEDDINGS = 163840


class ConfigError(DSV32Error, ValueError):
    """A model config is missing a field or its fields contradict each other."""


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


KIND_TEXT = {
    "count": "an int >= 0",
    "positive": "a positive int",
    "number": "a positive number",
    "str": "a string",
    "bool": "true or false",
}


def has_type(value: Any, kind: str) -> bool:
    """Whether ``value`` is of ``kind``: "count" (an int >= 0), "positive" (an int > 0), "number" (a
    finite int or float > 0), "str" or "bool" (never an int for a bool, nor a bool for an int)."""
    if kind in ("count", "positive"):
        return isinstance(value, int) and not isinstance(value, bool) and value >= (kind == "positive")
    if kind == "number":
        return is_number(value) and value > 0
    return isinstance(value, str if kind == "str" else bool)


# YaRN's optional parameters and the values they take (None = transformers' default).
_YARN_OPTIONAL = {
    "beta_fast": "a number",
    "beta_slow": "a number",
    "mscale": "a number",
    "mscale_all_dim": "a number",
    "attention_factor": "a number",
    "truncate": "true or false",
}


def check_yarn(rope: dict[str, Any] | None, name: str) -> None:
    """``rope`` is None (plain RoPE) or YaRN parameters with values of the right type (ConfigError
    naming ``name.key`` otherwise)."""
    if rope is None:
        return
    if not isinstance(rope, dict):
        raise ConfigError(f"{name}={rope!r}: must be an object of RoPE parameters or null")
    kind = rope.get("rope_type", rope.get("type"))
    if kind != "yarn":
        raise ConfigError(
            f"{name}: rope_type {kind!r} is not supported; only 'yarn' scaling or plain RoPE "
            "(rope_type 'default', or no RoPE scaling) is"
        )
    for key in ("factor", "original_max_position_embeddings"):
        if key not in rope:
            raise ConfigError(f"{name}.{key} is missing (required for YaRN)")
    factor, original = rope["factor"], rope["original_max_position_embeddings"]
    if not (is_number(factor) and factor > 0):
        raise ConfigError(f"{name}.factor={factor!r}: must be a positive number")
    if not (isinstance(original, int) and not isinstance(original, bool) and original > 0):
        raise ConfigError(f"{name}.original_max_position_embeddings={original!r}: must be a positive int")
    for key, kind in _YARN_OPTIONAL.items():
        value = rope.get(key)
        ok = isinstance(value, bool) if kind == "true or false" else is_number(value)
        if value is not None and not ok:
            raise ConfigError(f"{name}.{key}={value!r}: must be {kind} or null")


def read_hf(raw: dict[str, Any]) -> dict[str, Any]:
    """The field values of an HF ``config.json`` (under ModelConfig's names; other keys kept)."""
    data = dict(raw)
    kind = data.get("model_type")
    if kind is not None and kind not in ("deepseek_v32", "deepseek_v3"):
        raise ConfigError(
            f"a {kind!r} config, not DeepSeek-V3/V3.2: this class loads the V3.2 architecture; "
            "other Hugging Face models run through dsv32.engine.load_model (dsv32 serve, --backend local)"
        )
    kvh = data.get("num_key_value_heads")
    if kvh is not None and "num_attention_heads" in data and kvh != data["num_attention_heads"]:
        raise ConfigError(
            f"num_key_value_heads={kvh} must equal num_attention_heads={data['num_attention_heads']} (MLA)"
        )
    if data.get("mlp_layer_types") and "first_k_dense_replace" not in data:
        data["first_k_dense_replace"] = list(data["mlp_layer_types"]).count("dense")
    data["rope_theta"], data["rope_scaling"] = hf_rope(data)
    if data.get("q_lora_rank") == 0:
        data["q_lora_rank"] = None
    return data


def hf_rope(data: dict[str, Any]) -> tuple[Any, dict[str, Any] | None]:
    """``(rope_theta, rope_scaling)`` from an HF config, read as transformers' ``DeepseekV32Config``
    reads it: the v4 ``rope_scaling`` wins when it is a non-empty object, else v5 ``rope_parameters``,
    else plain RoPE; ``rope_theta`` inside that object wins over a top-level one (10000 without either);
    ``rope_type`` wins over the older ``type`` (``"default"`` without either); YaRN's
    ``original_max_position_embeddings`` is the top-level one when there is one, else the object's,
    else ``max_position_embeddings``; a ``null`` YaRN ``factor`` is
    ``max_position_embeddings / original_max_position_embeddings``."""
    scaling, params = data.pop("rope_scaling", None), data.pop("rope_parameters", None)
    for name, value in (("rope_scaling", scaling), ("rope_parameters", params)):
        if value is not None and not isinstance(value, dict):
            raise ConfigError(f"{name}={value!r}: must be an object of RoPE parameters or null")
    name = "rope_scaling" if scaling else "rope_parameters"
    rope = dict(scaling or params or {})
    nested = [k for k, v in rope.items() if isinstance(v, dict)]
    if nested:
        raise ConfigError(f"{name}: per-layer-type RoPE parameters ({', '.join(nested)}) are not supported")
    theta = rope.pop("rope_theta") if "rope_theta" in rope else data.pop("rope_theta", 10000.0)
    data.pop("rope_theta", None)
    kind = rope.pop("rope_type", None) or rope.get("type") or "default"
    rope.pop("type", None)
    if kind == "default":
        return theta, None
    rope = {"rope_type": kind, **rope}
    if kind == "yarn":
        max_len = data.get("max_position_embeddings", MAX_POSITION_EMBEDDINGS)
        if "original_max_position_embeddings" in data:
            rope["original_max_position_embeddings"] = data.pop("original_max_position_embeddings")
        original = rope.setdefault("original_max_position_embeddings", max_len)
        if rope.get("factor", 0) is None and is_number(max_len) and is_number(original) and original > 0:
            rope["factor"] = max_len / original
    check_yarn(rope, name)
    return theta, rope


# Reference inference config name -> HF name.
_REFERENCE_NAMES = {
    "dim": "hidden_size",
    "inter_dim": "intermediate_size",
    "moe_inter_dim": "moe_intermediate_size",
    "n_layers": "num_hidden_layers",
    "n_dense_layers": "first_k_dense_replace",
    "n_heads": "num_attention_heads",
    "n_activated_experts": "num_experts_per_tok",
    "n_expert_groups": "n_group",
    "n_limited_groups": "topk_group",
    "route_scale": "routed_scaling_factor",
    "score_func": "scoring_func",
    "max_seq_len": "max_position_embeddings",
}


# The defaults of DeepSeek's reference ModelArgs (inference/model.py of DeepSeek-V3.2-Exp) for the
# fields ModelConfig does not require (HF names) and for its YaRN fields (reference names, each with
# the type it must have).
_REFERENCE_DEFAULTS: dict[str, Any] = {
    "max_position_embeddings": 4096 * 4,
    "moe_intermediate_size": 1408,
    "first_k_dense_replace": 1,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "n_group": 1,
    "topk_group": 1,
    "scoring_func": "softmax",
    "routed_scaling_factor": 1.0,
    "q_lora_rank": 0,
    "original_seq_len": 4096,
    "rope_theta": 10000.0,
    "rope_factor": 40.0,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
}
_REFERENCE_YARN = {
    "max_position_embeddings": "positive",
    "original_seq_len": "positive",
    "rope_factor": "number",
    "beta_fast": "number",
    "beta_slow": "number",
    "mscale": "number",
}


def read_reference(raw: dict[str, Any]) -> dict[str, Any]:
    """The field values of a reference inference config, renamed to ModelConfig's names; what it leaves
    out takes the reference ModelArgs default (the architecture's required fields stay required)."""
    data = {**_REFERENCE_DEFAULTS, **{_REFERENCE_NAMES.get(k, k): v for k, v in raw.items()}}
    for name, kind in _REFERENCE_YARN.items():
        if not has_type(data[name], kind):
            shown = "max_seq_len" if name == "max_position_embeddings" else name
            raise ConfigError(f"{shown}={data[name]!r}: must be {KIND_TEXT[kind]}")
    max_len = data["max_position_embeddings"]
    original, factor, mscale = data.pop("original_seq_len"), data.pop("rope_factor"), data.pop("mscale")
    beta_fast, beta_slow = data.pop("beta_fast"), data.pop("beta_slow")
    # The reference applies YaRN (frequencies and softmax mscale) only beyond the original length.
    data["rope_scaling"] = (
        {
            "rope_type": "yarn",
            "factor": factor,
            "original_max_position_embeddings": original,
            "beta_fast": beta_fast,
            "beta_slow": beta_slow,
            "mscale": mscale,
            "mscale_all_dim": mscale,
        }
        if max_len > original
        else None
    )
    if data["q_lora_rank"] == 0:
        data["q_lora_rank"] = None
    # The reference normalizes the selected weights and uses the selection bias only with sigmoid scores.
    score = data["scoring_func"]
    data["norm_topk_prob"] = score == "sigmoid"
    data["topk_method"] = "noaux_tc" if score == "sigmoid" else "group_limited_greedy"
    for drop in ("dtype", "scale_fmt", "max_batch_size"):
        data.pop(drop, None)
    return data
