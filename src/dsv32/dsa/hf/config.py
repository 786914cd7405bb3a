"""The DSA settings of a Hugging Face model and the package's error type."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import ClassVar

from dsv32.dsa.attention import SPARSE_IMPLS
from dsv32.errors import DSV32Error
from dsv32.recipe import Checked, Rule, at_least, each, one_of

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
MODES = ("off", "dense", "sparse")
CONFIG_FILE = "dsa_config.json"
WEIGHTS_FILE = "dsa_indexer.safetensors"


class DSAError(DSV32Error, ValueError):
    """A model or checkpoint that DSA cannot be attached to or loaded into, or a bad DSA setting."""


@dataclass
class DSAConfig(Checked, error=DSAError):
    """What :func:`attach_dsa` adds. Defaults sized for a small dense model (SmolLM2-135M: 4 indexer
    heads × 64, top-256); the released V3.2's values are given beside each.

    Attributes:
        index_n_heads: indexer heads ``H_I`` (V3.2: 64).
        index_head_dim: indexer head dim ``D_I`` (V3.2: 128).
        index_topk: keys each query attends to in ``"sparse"`` mode (V3.2: 2048).
        index_rope_head_dim: leading dims of ``q_I``/``k_I`` with RoPE, even and at most
            ``index_head_dim``; default ``min(index_head_dim, model head_dim)`` (so an odd
            ``index_head_dim`` needs it set).
        layers: decoder layers that get DSA (default: all); the others stay dense.
        mode: initial mode, one of ``"off"``, ``"dense"``, ``"sparse"``.
        sparse_impl: ``"gather"`` (O(L·k)), ``"masked"`` (dense scores masked to the selection, the
            O(L²) reference) or ``"auto"`` (masked below the measured crossover, see
            :func:`~dsv32.dsa.prefer_dense`).
        seed: seed of the indexers' random initialization (layer i uses ``seed + i``).
    """

    RANGES: ClassVar[dict[str, Rule]] = {
        "index_n_heads": at_least(1),
        "index_head_dim": at_least(1),
        "index_topk": at_least(1),
        "index_rope_head_dim": at_least(0),
        "layers": each(at_least(0)),
        "mode": one_of(*MODES),
        "sparse_impl": one_of(*SPARSE_IMPLS),
    }

    index_n_heads: int = 4
    index_head_dim: int = 64
    index_topk: int = 256
    index_rope_head_dim: int | None = None
    layers: list[int] | None = None
    mode: str = "dense"
    sparse_impl: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        rope = self.index_rope_head_dim
        if rope is not None and (rope % 2 or rope > self.index_head_dim):
            raise DSAError(
                f"index_rope_head_dim = {rope}: must be even (RoPE rotates pairs) and <= index_head_dim = "
                f"{self.index_head_dim}"
            )
        if rope is None and self.index_head_dim % 2:
            raise DSAError(
                f"index_head_dim = {self.index_head_dim}: must be even when index_rope_head_dim is left to "
                "its default (min(index_head_dim, the model's head_dim), rotated in pairs); or set "
                "index_rope_head_dim to an even number below it"
            )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> DSAConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise DSAError(f"unknown DSA config keys {sorted(unknown)}; known: {sorted(known)}")
        return cls(**data)
