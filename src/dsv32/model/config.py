"""Model configuration: one dataclass, read from either config format DeepSeek-V3.2 ships with.

- the Hugging Face ``config.json`` (transformers' ``DeepseekV32Config`` field names; RoPE either as
  v5 ``rope_parameters`` or v4 ``rope_theta`` + ``rope_scaling``), and
- the reference inference config of DeepSeek's ``inference/`` folder (``dim``, ``n_layers``,
  ``n_dense_layers``, ``n_heads``, ``n_activated_experts``, ``route_scale``, ``score_func``, ...).

Field names and defaults follow the HF config (the released model's values). A missing required field
or an inconsistent combination raises :class:`ConfigError` naming the field.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from dsv32.errors import DSV32Error


class ConfigError(DSV32Error, ValueError):
    """A model config is missing a field or its fields contradict each other."""


# Fields without which the architecture is undefined; everything else has the released model's default.
_REQUIRED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "index_n_heads",
    "index_head_dim",
    "index_topk",
)

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


# Every field's type, checked before any range (nullable fields may also be None): "count" is an int
# >= 0, "positive" an int > 0, "number" a finite int or float > 0; rope_* are checked on their own.
_FIELD_TYPES: dict[str, tuple[str, bool]] = {
    **{name: ("positive", False) for name in _REQUIRED},
    "q_lora_rank": ("positive", True),
    "first_k_dense_replace": ("count", False),
    "moe_intermediate_size": ("count", False),
    "n_routed_experts": ("count", False),
    "n_shared_experts": ("count", False),
    "num_experts_per_tok": ("count", False),
    "n_group": ("count", False),
    "topk_group": ("count", False),
    "routed_scaling_factor": ("number", False),
    "scoring_func": ("str", False),
    "topk_method": ("str", False),
    "norm_topk_prob": ("bool", False),
    "max_position_embeddings": ("positive", False),
    "rms_norm_eps": ("number", False),
    "hidden_act": ("str", False),
    "attention_bias": ("bool", False),
    "tie_word_embeddings": ("bool", False),
    "bos_token_id": ("count", True),
    "pad_token_id": ("count", True),
    "num_nextn_predict_layers": ("count", False),
}
_KIND_TEXT = {
    "count": "an int >= 0",
    "positive": "a positive int",
    "number": "a positive number",
    "str": "a string",
    "bool": "true or false",
}
# How experts are selected: "noaux_tc" adds e_score_correction_bias for the selection (V3/V3.2),
# "group_limited_greedy" and "greedy" use the scores alone (V2).
_TOPK_METHODS = ("noaux_tc", "group_limited_greedy", "greedy")


def _has_type(value: Any, kind: str) -> bool:
    if kind in ("count", "positive"):
        return isinstance(value, int) and not isinstance(value, bool) and value >= (kind == "positive")
    if kind == "number":
        return _is_number(value) and value > 0
    return isinstance(value, str if kind == "str" else bool)


# The reference ModelArgs defaults of the fields ModelConfig does not require (HF names), and of its
# YaRN fields (reference names, with the type each must have).
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


@dataclass
class ModelConfig:
    """DeepSeek-V3.2 architecture hyper-parameters (HF names; defaults = the released 671B model)."""

    vocab_size: int = 129280
    hidden_size: int = 7168
    intermediate_size: int = 18432
    num_hidden_layers: int = 61
    num_attention_heads: int = 128
    # MLA
    q_lora_rank: int | None = 1536
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    # DeepSeekMoE
    first_k_dense_replace: int = 3
    moe_intermediate_size: int = 2048
    n_routed_experts: int = 256
    n_shared_experts: int = 1
    num_experts_per_tok: int = 8
    n_group: int = 8
    topk_group: int = 4
    routed_scaling_factor: float = 2.5
    scoring_func: str = "sigmoid"
    topk_method: str = "noaux_tc"
    norm_topk_prob: bool = True
    # DSA lightning indexer
    index_n_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 2048
    # RoPE: rope_scaling is None or a YaRN dict (factor, original_max_position_embeddings, beta_fast,
    # beta_slow, mscale, mscale_all_dim). The default is the released model's YaRN; an HF config.json
    # without RoPE keys means plain RoPE, as in transformers (see _hf_rope).
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = field(
        default_factory=lambda: {
            "rope_type": "yarn",
            "factor": 40.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        }
    )
    max_position_embeddings: int = 163840
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 1
    pad_token_id: int | None = None
    num_nextn_predict_layers: int = 0

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ derived sizes
    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def num_moe_layers(self) -> int:
        return self.num_hidden_layers - self.first_k_dense_replace if self.n_routed_experts else 0

    def is_moe_layer(self, layer_idx: int) -> bool:
        return self.n_routed_experts > 0 and layer_idx >= self.first_k_dense_replace

    @property
    def softmax_scale(self) -> float:
        """``qk_head_dim^-0.5``, times ``mscale²`` under YaRN (the softmax correction of YaRN)."""
        scale = self.qk_head_dim**-0.5
        rs = self.rope_scaling
        if rs and rs.get("mscale_all_dim"):
            m = yarn_mscale(float(rs["factor"]), float(rs["mscale_all_dim"]))
            scale *= m * m
        return scale

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        def need(cond: bool, name: str, why: str) -> None:
            if not cond:
                raise ConfigError(f"{name}={getattr(self, name)!r}: {why}")

        for name, (kind, nullable) in _FIELD_TYPES.items():
            value = getattr(self, name)
            if not ((nullable and value is None) or _has_type(value, kind)):
                need(False, name, f"must be {_KIND_TEXT[kind]}{' or null' if nullable else ''}")
        eos = self.eos_token_id
        eos_ids = eos if isinstance(eos, list) else [eos]
        need(
            eos is None or all(_has_type(e, "count") for e in eos_ids),
            "eos_token_id",
            "must be a token id, a list of token ids or null",
        )
        need(self.qk_rope_head_dim % 2 == 0, "qk_rope_head_dim", "must be even (RoPE rotates pairs)")
        need(
            self.index_head_dim >= self.qk_rope_head_dim,
            "index_head_dim",
            f"must be >= qk_rope_head_dim={self.qk_rope_head_dim} (the indexer ropes its first dims)",
        )
        need(
            0 <= self.first_k_dense_replace <= self.num_hidden_layers,
            "first_k_dense_replace",
            f"must be within [0, num_hidden_layers={self.num_hidden_layers}]",
        )
        need(self.hidden_act == "silu", "hidden_act", "only 'silu' is used by DeepSeek models")
        need(self.scoring_func in ("sigmoid", "softmax"), "scoring_func", "must be 'sigmoid' or 'softmax'")
        need(self.topk_method in _TOPK_METHODS, "topk_method", f"must be one of {', '.join(_TOPK_METHODS)}")
        if self.n_routed_experts:
            need(self.moe_intermediate_size > 0, "moe_intermediate_size", "must be positive with experts")
            need(
                0 < self.num_experts_per_tok <= self.n_routed_experts,
                "num_experts_per_tok",
                f"must be in [1, n_routed_experts={self.n_routed_experts}]",
            )
            need(
                self.n_group > 0 and self.n_routed_experts % self.n_group == 0,
                "n_group",
                f"must divide n_routed_experts={self.n_routed_experts}",
            )
            need(0 < self.topk_group <= self.n_group, "topk_group", f"must be in [1, n_group={self.n_group}]")
            need(
                self.topk_group * (self.n_routed_experts // self.n_group) >= self.num_experts_per_tok,
                "topk_group",
                f"the {self.topk_group} selected groups hold fewer experts than num_experts_per_tok="
                f"{self.num_experts_per_tok}",
            )
            need(
                self.topk_method != "greedy" or self.topk_group == self.n_group,
                "topk_method",
                f"'greedy' ignores expert groups: it needs topk_group == n_group={self.n_group} "
                "(or topk_method 'group_limited_greedy')",
            )
        need(_is_number(self.rope_theta) and self.rope_theta > 0, "rope_theta", "must be a positive number")
        _check_yarn(self.rope_scaling, "rope_scaling")

    # ------------------------------------------------------------------ I/O
    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """Build from a parsed HF ``config.json`` or a reference inference config."""
        data = _from_reference(raw) if "dim" in raw and "n_layers" in raw else _from_hf(raw)
        missing = [n for n in _REQUIRED if n not in data]
        if missing:
            raise ConfigError(f"config is missing required field(s): {', '.join(missing)}")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelConfig:
        """``path``: a ``config.json`` (either format) or a directory containing one."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ConfigError(f"no model config at {path}: pass a config.json or a checkpoint directory")
        with open(path, encoding="utf-8") as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as err:
                raise ConfigError(f"{path} is not valid JSON: {err.msg} (line {err.lineno})") from err
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must hold a JSON object of config fields")
        return cls.from_dict(data)

    def to_hf_dict(self) -> dict[str, Any]:
        """The HF ``config.json`` (transformers v5 layout) that ``DeepseekV32Config`` reads."""
        data = asdict(self)
        rope = data.pop("rope_scaling")
        theta = data.pop("rope_theta")
        data["rope_parameters"] = (
            {"rope_type": "default", "rope_theta": theta}
            if rope is None
            else {
                **{k: v for k, v in rope.items() if k != "type"},
                "rope_type": "yarn",
                "rope_theta": theta,
            }
        )
        data["num_key_value_heads"] = self.num_attention_heads
        data.update(model_type="deepseek_v32", architectures=["DeepseekV32ForCausalLM"])
        return data


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature correction ``0.1·mscale·ln(scale) + 1`` (1 when not scaled)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _from_hf(raw: dict[str, Any]) -> dict[str, Any]:
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
    data["rope_theta"], data["rope_scaling"] = _hf_rope(data)
    if data.get("q_lora_rank") == 0:
        data["q_lora_rank"] = None
    return data


def _hf_rope(data: dict[str, Any]) -> tuple[Any, dict[str, Any] | None]:
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
        max_len = data.get("max_position_embeddings", ModelConfig.max_position_embeddings)
        if "original_max_position_embeddings" in data:
            rope["original_max_position_embeddings"] = data.pop("original_max_position_embeddings")
        original = rope.setdefault("original_max_position_embeddings", max_len)
        if rope.get("factor", 0) is None and _is_number(max_len) and _is_number(original) and original > 0:
            rope["factor"] = max_len / original
    _check_yarn(rope, name)
    return theta, rope


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# YaRN's optional parameters and the values they take (None = transformers' default).
_YARN_OPTIONAL = {
    "beta_fast": "a number",
    "beta_slow": "a number",
    "mscale": "a number",
    "mscale_all_dim": "a number",
    "attention_factor": "a number",
    "truncate": "true or false",
}


def _check_yarn(rope: dict[str, Any] | None, name: str) -> None:
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
    if not (_is_number(factor) and factor > 0):
        raise ConfigError(f"{name}.factor={factor!r}: must be a positive number")
    if not (isinstance(original, int) and not isinstance(original, bool) and original > 0):
        raise ConfigError(f"{name}.original_max_position_embeddings={original!r}: must be a positive int")
    for key, kind in _YARN_OPTIONAL.items():
        value = rope.get(key)
        ok = isinstance(value, bool) if kind == "true or false" else _is_number(value)
        if value is not None and not ok:
            raise ConfigError(f"{name}.{key}={value!r}: must be {kind} or null")


def _from_reference(raw: dict[str, Any]) -> dict[str, Any]:
    # DeepSeek's reference ModelArgs defaults (inference/model.py of DeepSeek-V3.2-Exp) for what its
    # JSON files leave out; the architecture's required fields (_REQUIRED) stay required.
    data = {**_REFERENCE_DEFAULTS, **{_REFERENCE_NAMES.get(k, k): v for k, v in raw.items()}}
    for name, kind in _REFERENCE_YARN.items():
        if not _has_type(data[name], kind):
            shown = "max_seq_len" if name == "max_position_embeddings" else name
            raise ConfigError(f"{shown}={data[name]!r}: must be {_KIND_TEXT[kind]}")
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
