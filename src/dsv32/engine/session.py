"""A generation session that keeps its KV cache between calls: multi-step agents prefill only what
is new.

The session remembers the token ids whose keys and values its cache holds (``ids``). For a new prompt
``p`` it keeps the longest common prefix ``k`` of ``ids`` and ``p`` (at most ``len(p) - 1``: the last
prompt token is always run, its logits start the reply), cuts the cache back to ``k`` tokens and
prefills only ``p[k:]``; then it decodes one token at a time. After the call the cache holds the
prompt and the reply except its last token (which was sampled, never run). An agent's next prompt is
the previous prompt, the reply as the chat format renders it, and the tool results, so nearly all of
it is reused; where the rendered reply differs from the sampled tokens (a tokenization that is not
canonical, a parser that normalized the tool-call text), reuse stops at the first differing token.

- native :class:`~dsv32.model.DeepseekV32`: a :class:`~dsv32.model.cache.KVCache` (MLA latents and
  indexer keys) that grows by reallocation and copy when a prompt outgrows it; cutting back sets its
  ``length``.
- Hugging Face causal LMs: a :class:`~dsv32.engine.hfcache.GrowingCache` (a ``DynamicCache`` that
  appends in place), cut back with ``crop``, which keeps its buffers. On a model with DSA attached
  the indexer keys kept beside it are cut back too; a cache filled while DSA was not in sparse mode
  holds no indexer keys, so a sparse-mode call after it starts from an empty cache.

Counters: ``prefilled_tokens`` (tokens run through prefill, over all calls), ``reused_tokens``.
Batch size one; not thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from dsv32.engine.backends import backend_for, crop_hf_cache, hf_index_keys
from dsv32.engine.constraint import Constraint
from dsv32.engine.sampling import SamplingParams, sample_next
from dsv32.model import DeepseekV32


@dataclass
class SessionOutput:
    tokens: list[int]  # the reply, the stop token included when it was produced
    finish_reason: str  # "stop" (a stop token) or "length" (max_new_tokens)
    prefilled: int  # prompt tokens run through the model in this call
    reused: int  # prompt tokens whose cache entries were kept


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if list(a[:mid]) == list(b[:mid]):
            lo = mid
        else:
            hi = mid
    return lo


class Session:
    """One growing sequence and its KV cache over a native V3.2 model or a transformers causal LM."""

    def __init__(self, model, *, reuse: bool = True) -> None:
        backend = backend_for(model)  # raises TypeError for anything generate() cannot drive either
        self.model = model
        self.native = isinstance(model, DeepseekV32)
        self.dsa = None  # the DSA handle of an HF model with DSA attached
        if not self.native:
            from dsv32.dsa.hf import get_dsa, has_dsa

            self.dsa = get_dsa(model) if has_dsa(model) else None
        self.reuse = reuse
        self.device = backend.device
        self.cache = None
        self.ids: list[int] = []
        self.prefilled_tokens = 0
        self.reused_tokens = 0
        self._hf_kwargs = {} if self.native else backend.prefill_kwargs  # logits_to_keep=1 where taken
        self._cache_keyword = None if self.native else backend.cache_keyword

    def reset(self) -> None:
        self.cache, self.ids = None, []

    # ---------------------------------------------------------------------------------- cache
    def _truncate(self, keep: int) -> None:
        if self.cache is None or not self.reuse:
            keep = 0
        if keep == 0:
            self.cache, self.ids = None, []
            return
        if self.native:
            self.cache.length = keep
        else:
            crop_hf_cache(self.cache, keep)
            if self.dsa is not None and self.dsa.mode == "sparse" and not self._index_keys_cover(keep):
                self.cache, self.ids = None, []
                return
        self.ids = self.ids[:keep]

    def _index_keys_cover(self, keep: int) -> bool:
        """Every DSA layer holds the indexer keys of the ``keep`` cached tokens."""
        store = hf_index_keys(self.cache)
        return all(i in store and store[i].shape[1] == keep for i in self.dsa.modules)

    def _ensure_capacity(self, total: int) -> None:
        """Native caches are preallocated: grow (×2, at least ``total``) and copy what is held."""
        if not self.native:
            if self.cache is None:
                from dsv32.engine.hfcache import GrowingCache

                self.cache = GrowingCache(self.model.config)
            return
        limit = self.model.config.max_position_embeddings
        if total > limit:
            raise ValueError(
                f"the sequence needs {total} positions but the model has max_position_embeddings={limit}; "
                "shorten the prompt or max_new_tokens (an agent: set context_window below it)"
            )
        if self.cache is not None and total <= self.cache.max_len:
            return
        old = self.cache
        size = min(limit, max(total, 2 * old.max_len if old is not None else 0, 256))
        self.cache = self.model.new_cache(1, size)
        if old is not None:
            self.cache.copy_from(old)
            self.cache.length = old.length

    def _forward(self, ids: list[int]) -> torch.Tensor:
        """Run ``ids`` after the cached tokens; the next-token logits ``[V]``."""
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        start = len(self.ids)
        if self.native:
            out = self.model(x, cache=self.cache, logits_to_keep=1)
        else:
            positions = torch.arange(start, start + len(ids), device=self.device)[None]
            out = self.model(
                input_ids=x,
                position_ids=positions,
                use_cache=True,
                **{self._cache_keyword: self.cache},
                **self._hf_kwargs,
            )
            self.cache = getattr(out, self._cache_keyword)
        self.ids.extend(ids)
        return out.logits[0, -1]

    # ---------------------------------------------------------------------------------- generate
    @torch.no_grad()
    def generate(
        self,
        prompt_ids: Sequence[int],
        *,
        max_new_tokens: int,
        sampling: SamplingParams,
        stop_ids: Sequence[int],
        generator: torch.Generator | None = None,
        on_token: Callable[[int], None] | None = None,
        constraint: Constraint | None = None,
    ) -> SessionOutput:
        """Continue from ``prompt_ids`` (reusing the cache where it matches) until a token of
        ``stop_ids`` or ``max_new_tokens``; with ``constraint``, only among the tokens its grammar
        allows (:mod:`dsv32.engine.constraint`)."""
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("the prompt needs at least one token")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        keep = min(common_prefix(self.ids, prompt), len(prompt) - 1)
        self._truncate(keep)
        keep = len(self.ids)
        self._ensure_capacity(len(prompt) + max_new_tokens)
        logits = self._forward(prompt[keep:])
        self.prefilled_tokens += len(prompt) - keep
        self.reused_tokens += keep
        stops = set(int(s) for s in stop_ids)
        tokens: list[int] = []
        finish = "length"
        for i in range(max_new_tokens):
            allowed = None if constraint is None else constraint.allowed(logits.device)[None]
            token, _, _ = sample_next(logits[None].float(), sampling, generator, allowed)
            token = int(token[0])
            if constraint is not None:
                constraint.advance(token)
            tokens.append(token)
            if on_token is not None:
                on_token(token)
            if token in stops:
                finish = "stop"
                break
            if i + 1 < max_new_tokens:
                logits = self._forward([token])
        return SessionOutput(tokens, finish, len(prompt) - keep, keep)
