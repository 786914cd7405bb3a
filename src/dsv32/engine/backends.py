"""How :func:`~dsv32.engine.generate` drives each kind of model: a prefill and a one-token step.

The decode loop is shared; a backend only owns the model's KV cache and knows its call convention:

- :class:`NativeBackend` — :class:`~dsv32.model.DeepseekV32` with its preallocated sparse
  :class:`~dsv32.model.cache.KVCache` (MLA latents + indexer keys), optionally recording MoE routing;
- :class:`HFBackend` — a Hugging Face causal LM (Llama, Qwen2/3, Mistral, ..., with or without DSA
  attached) with a :class:`~dsv32.engine.hfcache.GrowingCache`, transformers' ``DynamicCache`` with
  K/V appended in place. Positions are counted from the attention mask, so a left-padded row sees the
  same positions as the same prompt alone.

Both take the attention mask over every token so far (``[b, S]``, 1 = real) and return the next-token
logits ``[b, V]`` of the last position only. ``drop_rows`` keeps (or repeats) rows of the cache, so
later steps only compute rows that are still generating (``can_drop_rows`` says whether it may).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence

import torch

from dsv32.dsa.hf import INDEX_KEYS_ATTR, cut_index_keys, get_dsa, has_dsa
from dsv32.dsa.keep import IndexingError
from dsv32.model import DeepseekV32


class NativeBackend:
    """:class:`~dsv32.model.DeepseekV32`: the cache is allocated for ``max_len`` tokens at prefill."""

    def __init__(
        self, model: DeepseekV32, return_routing: bool = False, return_indexing: bool = False
    ) -> None:
        self.model = model
        self.return_routing = return_routing
        self.return_indexing = return_indexing
        self.cache = None
        self.routing: list[torch.Tensor] = []  # [num_moe_layers, B, T, k] per forward
        self.indexing: list[torch.Tensor] = []  # [num_hidden_layers, B, T, index_topk] per forward
        cfg = model.config
        self.eos_token_id = cfg.eos_token_id
        self.pad_token_id = cfg.pad_token_id
        self.device = model.lm_head.weight.device

    @property
    def can_drop_rows(self) -> bool:
        # routing and selections are recorded for every row and position
        return not (self.return_routing or self.return_indexing)

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_len: int) -> torch.Tensor:
        self.cache = self.model.new_cache(input_ids.shape[0], max_len)
        return self._forward(input_ids, attention_mask, logits_to_keep=1)

    def step(self, tokens: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self._forward(tokens[:, None], attention_mask)

    def drop_rows(self, keep: torch.Tensor) -> None:
        self.cache.reorder(keep)

    # prefix reuse (dsv32.engine.prefix): rows' entries out of the cache and a batch cache built from them
    @property
    def can_reuse_prefix(self) -> bool:
        # kept positions' routing and selections are not recorded again
        return not (self.return_routing or self.return_indexing)

    def fresh(self) -> NativeBackend:
        return NativeBackend(self.model)

    def export_rows(self, positions: list[int], lengths: list[int], width: int) -> list[dict]:
        """Batch rows ``positions``' entries: the last ``lengths[i]`` of the ``width`` cached columns."""
        if self.cache.length != width:
            raise ValueError(f"the cache holds {self.cache.length} columns, not {width}")
        return [
            {name: t[:, r : r + 1, width - n : width].clone() for name, t in self.cache.tensors().items()}
            for r, n in zip(positions, lengths)
        ]

    def prefill_kept(
        self, kept: list, C: int, chunk: torch.Tensor, attention_mask: torch.Tensor, max_len: int
    ) -> torch.Tensor:
        """Row ``j``'s first ``kept[j][1]`` positions from entries ``kept[j][0]``, right-aligned in
        ``C`` columns, then ``chunk`` ``[B, T]`` run after them (``attention_mask`` ``[B, C + T]``)."""
        self.cache = self.model.new_cache(chunk.shape[0], max_len)
        for j, (kv, c) in enumerate(kept):
            if c:
                for name, dst in self.cache.tensors().items():
                    dst[:, j, C - c : C] = kv[name][:, 0, :c]
        self.cache.length = C
        return self._forward(chunk, attention_mask, logits_to_keep=1)

    def _forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs) -> torch.Tensor:
        out = self.model(
            input_ids,
            attention_mask=attention_mask,
            cache=self.cache,
            return_routing=self.return_routing,
            return_indexing=self.return_indexing,
            **kwargs,
        )
        if self.return_routing and out.routing is not None:
            self.routing.append(out.routing)
        if self.return_indexing:
            self.indexing.append(out.indexing)
        return out.logits[:, -1]

    def recorded_routing(self) -> torch.Tensor | None:
        """``[num_moe_layers, B, P + steps, k]``, or None (not asked for, or no MoE layer)."""
        return torch.cat(self.routing, dim=2) if self.routing else None

    def recorded_indexing(self) -> torch.Tensor | None:
        """``[num_hidden_layers, B, P + steps, index_topk]`` row positions, or None (not asked for)."""
        return torch.cat(self.indexing, dim=2) if self.indexing else None


class HFBackend:
    """A transformers causal LM with a :class:`~dsv32.engine.hfcache.GrowingCache` (a ``DynamicCache``
    that appends in place, passed as :func:`hf_cache_keyword`, ``use_cache=True``)."""

    def __init__(self, model, return_indexing: bool = False) -> None:
        self.model = model
        self.cache = None
        self.return_indexing = return_indexing
        self.indexing: list[torch.Tensor] = []  # [DSA layers, B, T, index_topk] per forward
        # transformers' models compute the LM head on the last position only with `logits_to_keep=1`
        self.prefill_kwargs = (
            {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
        )
        self.cache_keyword = hf_cache_keyword(model)
        self.can_drop_rows = not return_indexing  # selections are recorded for every row and position
        gen, cfg = getattr(model, "generation_config", None), model.config
        self.eos_token_id = _first_set(getattr(gen, "eos_token_id", None), getattr(cfg, "eos_token_id", None))
        self.pad_token_id = _first_set(getattr(gen, "pad_token_id", None), getattr(cfg, "pad_token_id", None))
        self.device = model.device

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_len: int) -> torch.Tensor:
        from dsv32.engine.hfcache import GrowingCache

        self.cache = GrowingCache(self.model.config)
        return self._forward(input_ids, attention_mask, **self.prefill_kwargs)

    def step(self, tokens: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.fast_decode and not self.model.training:
            from dsv32.engine.fastdecode import decode_step

            return decode_step(self.model, self.cache, tokens, attention_mask)
        return self._forward(tokens[:, None], attention_mask)

    @functools.cached_property
    def fast_decode(self) -> bool:
        """Whether decode steps run :func:`dsv32.engine.fastdecode.decode_step` (a Llama-family model
        it computes exactly; anything else runs the model's own forward)."""
        from dsv32.engine.fastdecode import supported

        return not self.return_indexing and supported(self.model)

    def drop_rows(self, keep: torch.Tensor) -> None:
        self.cache.batch_select_indices(keep)
        store = hf_index_keys(self.cache)  # DSA: the indexer keys beside K/V are per row too
        for layer, keys in store.items():
            store[layer] = keys[keep]

    # prefix reuse (dsv32.engine.prefix)
    @functools.cached_property
    def can_reuse_prefix(self) -> bool:
        """Every cache layer is a full-attention one (a sliding window's entries cannot be cut per row)."""
        from dsv32.engine.hfcache import full_attention

        return not self.return_indexing and full_attention(self.model.config)

    def fresh(self) -> HFBackend:
        return HFBackend(self.model)

    def export_rows(self, positions: list[int], lengths: list[int], width: int) -> list[dict]:
        """Batch rows ``positions``' entries: the last ``lengths[i]`` of the ``width`` cached columns
        (K/V of every layer and, with DSA attached, the indexer keys)."""
        if self.cache.get_seq_length() != width:
            raise ValueError(f"the cache holds {self.cache.get_seq_length()} columns, not {width}")
        layers, index = self.cache.layers, hf_index_keys(self.cache)
        return [
            {
                "keys": [layer.keys[r : r + 1, :, width - n :].clone() for layer in layers],
                "values": [layer.values[r : r + 1, :, width - n :].clone() for layer in layers],
                "index": {i: keys[r : r + 1, width - n :].clone() for i, keys in index.items()},
            }
            for r, n in zip(positions, lengths)
        ]

    def prefill_kept(
        self, kept: list, C: int, chunk: torch.Tensor, attention_mask: torch.Tensor, max_len: int
    ) -> torch.Tensor:
        """As :meth:`NativeBackend.prefill_kept`, over a fresh :class:`~dsv32.engine.hfcache.GrowingCache`."""
        from dsv32.engine.hfcache import GrowingCache

        B = chunk.shape[0]
        sample = next(kv for kv, c in kept if c)
        self.cache = GrowingCache(self.model.config)

        def batched(get, like: torch.Tensor, dim: int) -> torch.Tensor:
            """``[B, ..., C (at dim), ...]``: row j's first c_j entries ``get(kv_j)`` right-aligned."""
            shape = list(like.shape)
            shape[0], shape[dim] = B, C
            out = like.new_zeros(shape)
            for j, (kv, c) in enumerate(kept):
                if c:
                    out[j].narrow(dim - 1, C - c, c).copy_(get(kv)[0].narrow(dim - 1, 0, c))
            return out

        for i, layer in enumerate(self.cache.layers):
            keys = batched(lambda kv, i=i: kv["keys"][i], sample["keys"][i], 2)
            values = batched(lambda kv, i=i: kv["values"][i], sample["values"][i], 2)
            layer.lazy_initialization(keys, values)
            layer.keys, layer.values = keys, values
        if sample["index"]:
            self.cache.__dict__[INDEX_KEYS_ATTR] = {
                i: batched(lambda kv, i=i: kv["index"][i], like, 1) for i, like in sample["index"].items()
            }
        return self._forward(chunk, attention_mask, **self.prefill_kwargs)

    def _forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs) -> torch.Tensor:
        from dsv32.engine.attention import decode_attention  # imports transformers

        T = input_ids.shape[1]
        # position = number of real tokens before this one: padding does not shift a row's positions
        position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)[:, -T:]
        call = functools.partial(
            self.model,
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            **{self.cache_keyword: self.cache},
            **kwargs,
        )
        with decode_attention(self.model):
            if self.return_indexing:
                with get_dsa(self.model).indexing(record=True) as handle:
                    out = call()
                    self.indexing.append(handle.stacked_indexing())
            else:
                out = call()
        self.cache = getattr(out, self.cache_keyword)
        return out.logits[:, -1]

    def recorded_routing(self) -> None:
        return None

    def recorded_indexing(self) -> torch.Tensor | None:
        """``[DSA layers, B, P + steps, index_topk]`` row positions, or None (not asked for)."""
        return torch.cat(self.indexing, dim=2) if self.indexing else None


def hf_cache_keyword(model) -> str:
    """The keyword a transformers model takes its KV cache by, and the field its output returns it in:
    ``cache`` from transformers 5.24 on, ``past_key_values`` before (still accepted there, with a
    deprecation warning)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def hf_index_keys(cache) -> dict:
    """The indexer keys a DSA-attached model keeps on an HF cache, by layer (``[B, S, d]``; empty without DSA)."""
    return cache.__dict__.get(INDEX_KEYS_ATTR, {})


def crop_hf_cache(cache, keep: int) -> None:
    """Cut a ``DynamicCache`` back to its first ``keep`` tokens, the indexer keys of DSA layers too."""
    remove = cache.get_seq_length() - keep
    if remove > 0:
        cache.crop(-remove)  # transformers 5: a negative count removes that many tokens
    cut_index_keys(cache, keep)


def _first_set(*values):
    return next((v for v in values if v is not None), None)


def backend_for(
    model, return_routing: bool = False, return_indexing: bool = False
) -> NativeBackend | HFBackend:
    """The backend of ``model``: a :class:`~dsv32.model.DeepseekV32` or a transformers causal LM.
    ``return_indexing`` needs DSA in sparse mode (the native model, or DSA attached)."""
    if isinstance(model, DeepseekV32):
        return NativeBackend(model, return_routing, return_indexing)
    try:
        from transformers import PreTrainedModel
    except ImportError:  # transformers is an optional dependency
        PreTrainedModel = None
    if PreTrainedModel is None or not isinstance(model, PreTrainedModel):
        raise TypeError(
            "generate needs a dsv32.model.DeepseekV32 or a transformers causal LM, "
            f"got {type(model).__name__}"
        )
    if not model.can_generate():
        raise TypeError(
            f"{type(model).__name__} has no language-model head; load it with AutoModelForCausalLM"
        )
    if return_routing:
        raise ValueError(
            f"return_routing=True needs a MoE model with routing capture (dsv32.model.DeepseekV32); "
            f"{type(model).__name__} is a transformers model: pass return_routing=False"
        )
    if return_indexing and not (has_dsa(model) and get_dsa(model).mode == "sparse"):
        raise IndexingError(
            f"return_indexing=True needs DSA in sparse mode; {type(model).__name__} has "
            + (f"DSA in {get_dsa(model).mode!r} mode" if has_dsa(model) else "no DSA attached")
            + ": attach_dsa(model, ...) in sparse mode, or pass return_indexing=False"
        )
    return HFBackend(model, return_indexing)


def eos_ids(eos_token_id: int | Sequence[int] | None, device: torch.device) -> torch.Tensor:
    """``[n]`` EOS ids (possibly none) from an int, a list, or None."""
    return torch.as_tensor(
        [] if eos_token_id is None else eos_token_id, dtype=torch.long, device=device
    ).flatten()


def pad_prompts(
    prompts: Sequence[Sequence[int]] | torch.Tensor, pad_token_id: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad ragged prompts → ``(input_ids [B, P], attention_mask [B, P])``."""
    if isinstance(prompts, torch.Tensor):
        ids = prompts.to(device)
        return ids, torch.ones_like(ids)
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    P = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), P), pad_token_id, dtype=torch.long, device=device)
    mask = torch.zeros(len(prompts), P, dtype=torch.long, device=device)
    for i, p in enumerate(prompts):
        ids[i, P - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
        mask[i, P - len(p) :] = 1
    return ids, mask
