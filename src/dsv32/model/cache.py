"""The V3.2 KV cache: per layer, the MLA latent and the indexer keys — never per-head K/V.

Per token and layer the cache holds ``kv_lora_rank`` normalized latent dims, ``qk_rope_head_dim``
roped key dims (together the ``c[s]`` entry DSA selects) and ``index_head_dim`` indexer key dims:
576 + 128 values per token and layer for the released model, where per-head K/V would take
128 · (192 + 128) = 40960.
"""

from __future__ import annotations

import torch

from dsv32.model.config import ModelConfig


class KVCache:
    """Preallocated cache for ``batch_size`` sequences of up to ``max_len`` tokens.

    Layers write their new entries at ``[length, length + T)`` with :meth:`write`; the model advances
    :attr:`length` once per forward with :meth:`advance`. Batches are left-padded by the engine; the
    padding is masked through the model's ``attention_mask``, not here.
    """

    def __init__(
        self,
        config: ModelConfig,
        batch_size: int,
        max_len: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        L = config.num_hidden_layers
        self.max_len = max_len
        self.length = 0
        self.kv_latent = torch.zeros(L, batch_size, max_len, config.kv_lora_rank, device=device, dtype=dtype)
        self.k_rope = torch.zeros(L, batch_size, max_len, config.qk_rope_head_dim, device=device, dtype=dtype)
        self.index_keys = torch.zeros(
            L, batch_size, max_len, config.index_head_dim, device=device, dtype=dtype
        )

    @property
    def batch_size(self) -> int:
        return self.kv_latent.shape[1]

    def tensors(self) -> dict[str, torch.Tensor]:
        """The per-token tensors by attribute name, each ``[L, batch_size, max_len, *]``."""
        return {"kv_latent": self.kv_latent, "k_rope": self.k_rope, "index_keys": self.index_keys}

    def write(
        self, layer: int, kv_latent: torch.Tensor, k_rope: torch.Tensor, index_keys: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Store ``[B, T, *]`` new entries of ``layer``; return its entries ``[B, length + T, *]``."""
        B, T = kv_latent.shape[:2]
        if self.batch_size != B:
            raise ValueError(f"KV cache of batch {self.batch_size} written with a batch of {B} sequences")
        end = self.length + T
        if end > self.max_len:
            raise ValueError(
                f"KV cache overflow: {end} tokens > max_len={self.max_len}; allocate a larger cache"
            )
        self.kv_latent[layer, :, self.length : end] = kv_latent
        self.k_rope[layer, :, self.length : end] = k_rope
        self.index_keys[layer, :, self.length : end] = index_keys
        return (
            self.kv_latent[layer, :, :end],
            self.k_rope[layer, :, :end],
            self.index_keys[layer, :, :end],
        )

    def advance(self, n: int) -> None:
        self.length += n

    def reorder(self, rows: torch.Tensor) -> None:
        """Keep (and repeat) the batch rows ``rows`` — for beam-style or group sampling from one prefix."""
        for name, value in self.tensors().items():
            setattr(self, name, value[:, rows])

    def copy_from(self, src: KVCache, rows: slice = slice(None), start: int = 0) -> None:
        """Write the ``src.length`` tokens of every row of ``src`` into batch rows ``rows`` at positions
        ``start`` on (``length`` is the caller's to set)."""
        for name, dst in self.tensors().items():
            dst[:, rows, start : start + src.length] = getattr(src, name)[:, :, : src.length]

    def drop_front(self, n: int) -> None:
        """Forget the first ``n`` positions of every row (left padding no row uses any more)."""
        for name, value in self.tensors().items():
            setattr(self, name, value[:, :, n:])
        self.length -= n
        self.max_len -= n

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())
