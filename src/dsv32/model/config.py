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
    # beta_slow, mscale, mscale_all_dim).
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

        for name in _REQUIRED:
            need(
                isinstance(getattr(self, name), int) and getattr(self, name) > 0,
                name,
                "must be a positive int",
            )
        need(self.q_lora_rank is None or self.q_lora_rank > 0, "q_lora_rank", "must be null or positive")
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
        if self.rope_scaling is not None:
            rs = self.rope_scaling
            kind = rs.get("rope_type", rs.get("type"))
            need(kind == "yarn", "rope_scaling", "only YaRN scaling (rope_type 'yarn') or null is supported")
            for key in ("factor", "original_max_position_embeddings"):
                if key not in rs:
                    raise ConfigError(f"rope_scaling.{key} is missing (required for YaRN)")

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
    rope = data.pop("rope_parameters", None)
    if isinstance(rope, dict) and "rope_theta" in rope:  # transformers v5
        data["rope_theta"] = rope["rope_theta"]
        kind = rope.get("rope_type", "default")
        data["rope_scaling"] = (
            None if kind == "default" else {k: v for k, v in rope.items() if k != "rope_theta"}
        )
    elif "rope_scaling" in data and data["rope_scaling"] is not None:  # transformers v4
        rs = dict(data["rope_scaling"])
        rs["rope_type"] = rs.pop("type", rs.get("rope_type"))
        data["rope_scaling"] = rs
    elif "rope_scaling" not in data and "rope_theta" in data:
        data["rope_scaling"] = None
    if isinstance(data.get("rope_scaling"), dict):
        rs = data["rope_scaling"]
        rs.setdefault("rope_type", rs.pop("type", "yarn"))
        if rs.get("factor") is None and "original_max_position_embeddings" in rs:
            rs["factor"] = (
                data.get("max_position_embeddings", 163840) / rs["original_max_position_embeddings"]
            )
    if data.get("q_lora_rank") == 0:
        data["q_lora_rank"] = None
    return data


def _from_reference(raw: dict[str, Any]) -> dict[str, Any]:
    data = {_REFERENCE_NAMES.get(k, k): v for k, v in raw.items()}
    # Reference ModelArgs defaults for what its JSON files leave out.
    max_len = data.setdefault("max_position_embeddings", 4096 * 4)
    original = data.pop("original_seq_len", 4096)
    factor = data.pop("rope_factor", 40.0)
    mscale = data.pop("mscale", 1.0)
    beta_fast, beta_slow = data.pop("beta_fast", 32.0), data.pop("beta_slow", 1.0)
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
    data.setdefault("rope_theta", 10000.0)
    if data.get("q_lora_rank") == 0:
        data["q_lora_rank"] = None
    score = data.get("scoring_func", "softmax")
    data["scoring_func"] = score
    # The reference normalizes the selected weights and uses the selection bias only with sigmoid scores.
    data["norm_topk_prob"] = score == "sigmoid"
    data["topk_method"] = "noaux_tc" if score == "sigmoid" else "group_limited_greedy"
    data.setdefault("n_group", 1)
    data.setdefault("topk_group", 1)
    data.setdefault("first_k_dense_replace", 1)
    data.setdefault("routed_scaling_factor", 1.0)
    for drop in ("dtype", "scale_fmt", "max_batch_size"):
        data.pop(drop, None)
    return data
