"""Model configuration: one dataclass, read from either config format DeepSeek-V3.2 ships with.

- the Hugging Face ``config.json`` (transformers' ``DeepseekV32Config`` field names; RoPE either as
  v5 ``rope_parameters`` or v4 ``rope_theta`` + ``rope_scaling``), and
- the reference inference config of DeepSeek's ``inference/`` folder (``dim``, ``n_layers``,
  ``n_dense_layers``, ``n_heads``, ``n_activated_experts``, ``route_scale``, ``score_func``, ...).

Field names and defaults follow the HF config (the released model's values); the two formats are read
by :mod:`dsv32.model.config_formats`. A missing required field, a value of the wrong type or an
inconsistent combination raises :class:`ConfigError` naming the field.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from dsv32.model.config_formats import (
    KIND_TEXT,
    MAX_POSITION_EMBEDDINGS,
    ConfigError,
    check_yarn,
    has_type,
    is_number,
    read_hf,
    read_reference,
)

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
# How experts are selected: "noaux_tc" adds e_score_correction_bias for the selection (V3/V3.2),
# "group_limited_greedy" and "greedy" use the scores alone (V2).
_TOPK_METHODS = ("noaux_tc", "group_limited_greedy", "greedy")


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
    # without RoPE keys means plain RoPE, as in transformers (see hf_rope).
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
    max_position_embeddings: int = MAX_POSITION_EMBEDDINGS
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
            if not ((nullable and value is None) or has_type(value, kind)):
                need(False, name, f"must be {KIND_TEXT[kind]}{' or null' if nullable else ''}")
        eos = self.eos_token_id
        eos_ids = eos if isinstance(eos, list) else [eos]
        need(
            eos is None or all(has_type(e, "count") for e in eos_ids),
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
        need(is_number(self.rope_theta) and self.rope_theta > 0, "rope_theta", "must be a positive number")
        check_yarn(self.rope_scaling, "rope_scaling")

    # ------------------------------------------------------------------ I/O
    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """Build from a parsed HF ``config.json`` or a reference inference config."""
        data = read_reference(raw) if "dim" in raw and "n_layers" in raw else read_hf(raw)
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
