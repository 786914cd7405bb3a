"""Continuous batching over the engine's KV caches: sequences join a running batch after their own
prefill and leave it at any decode step.

A running batch is ``B`` rows that decode one token each per :meth:`RunningBatch.step`. Its cache and
attention mask ``[B, S]`` are left-aligned as in :func:`~dsv32.engine.generate`: every row's real
tokens are a contiguous suffix of the ``S`` columns, padding is masked out, and positions are counted
from the mask, so a row computes what it would compute alone (up to floating-point rounding of the
batched matmuls).

- :meth:`RunningBatch.add` prefills one prompt alone (``[1, P]``, one forward), repeats its cache for
  ``copies`` rows (``n`` samples of one prompt share the prefill) and merges it into the batch: the
  shorter side is left-padded to ``S = max(S_batch, P)`` with masked zero entries. Its two halves,
  :meth:`RunningBatch.prefill` (which leaves the batch untouched) and :meth:`RunningBatch.join`, let
  a caller tell a prompt that cannot join from a batch that broke; :meth:`RunningBatch.prefill_many`
  prefills several prompts in one left-padded forward (waiting requests admitted together).
- :meth:`RunningBatch.remove` drops rows and trims leading columns that no remaining row uses.
- :meth:`RunningBatch.step` feeds each row its last sampled token and keeps the next-token logits.
- With a :class:`~dsv32.engine.prefix.PrefixStore` (a server's prefix cache), :meth:`RunningBatch.prefill`
  runs only what the store does not hold of a prompt and keeps the prompt's entries, and
  :meth:`RunningBatch.keep` keeps rows' entries (a finished reply, for the next turn's prompt).

Both kinds of cache are handled: the native :class:`~dsv32.model.cache.KVCache` (preallocated; merging
reallocates it to ``S`` plus the largest remaining token budget of any row) and transformers'
``DynamicCache`` (per-layer K/V ``[B, H, S, D]``, plus the indexer keys a DSA-attached model keeps on
the cache object); sliding-window caches cannot be merged (:func:`check_batchable`).
:func:`sample_rows` samples every row with its own parameters and generator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dsv32.engine.backends import HFBackend, NativeBackend, backend_for, hf_index_keys, pad_prompts
from dsv32.engine.prefix import PrefixStore
from dsv32.engine.sampling import SamplingParams, sample_next
from dsv32.errors import DSV32Error


class BatchError(DSV32Error, ValueError):
    """A request the running batch cannot take (an empty prompt, no token budget, an unsupported cache)."""


# ---------------------------------------------------------------------------------- cache surgery
def _pad_seq(t: torch.Tensor, dim: int, left: int) -> torch.Tensor:
    """``t`` with ``left`` zero entries prepended along ``dim``."""
    if left == 0:
        return t
    shape = list(t.shape)
    shape[dim] = left
    return torch.cat((t.new_zeros(shape), t), dim=dim)


def _native_merge(model, a, b, capacity: int):
    """A new native cache holding the rows of ``a`` then ``b``, right-aligned at ``S = max`` length."""
    S = max(a.length, b.length)
    merged = model.new_cache(a.batch_size + b.batch_size, capacity)
    merged.copy_from(a, slice(0, a.batch_size), S - a.length)
    merged.copy_from(b, slice(a.batch_size, None), S - b.length)
    merged.length = S
    return merged


_SLIDING = (
    "continuous batching needs full-attention KV caches; this model has sliding-window layers: "
    "serve it with --max-batch 1"
)


def _hf_layers(cache) -> list:
    layers = list(cache.layers)
    if any(getattr(layer, "is_sliding", False) for layer in layers):
        raise BatchError(_SLIDING)
    return layers


def _hf_check_merge(a, b) -> None:
    """Raise :class:`BatchError` unless caches ``a`` and ``b`` can be merged (before either changes)."""
    if len(_hf_layers(a)) != len(_hf_layers(b)):
        raise BatchError("the two caches have different numbers of layers; were they filled by one model?")
    if set(hf_index_keys(a)) != set(hf_index_keys(b)):
        raise BatchError(
            "the two caches hold indexer keys of different layers; were they filled by one model?"
        )


def _hf_merge(a, b) -> None:
    """Append the rows of cache ``b`` to cache ``a`` (in place), right-aligned at the longer length."""
    _hf_check_merge(a, b)
    Sa, Sb = a.get_seq_length(), b.get_seq_length()
    S = max(Sa, Sb)
    for la, lb in zip(a.layers, b.layers, strict=True):
        la.keys = torch.cat((_pad_seq(la.keys, 2, S - Sa), _pad_seq(lb.keys, 2, S - Sb)), dim=0)
        la.values = torch.cat((_pad_seq(la.values, 2, S - Sa), _pad_seq(lb.values, 2, S - Sb)), dim=0)
    keys_a, keys_b = hf_index_keys(a), hf_index_keys(b)
    for layer, ka in keys_a.items():
        keys_a[layer] = torch.cat((_pad_seq(ka, 1, S - Sa), _pad_seq(keys_b[layer], 1, S - Sb)), dim=0)


def _hf_trim(cache, drop: int) -> None:
    for layer in _hf_layers(cache):
        layer.keys, layer.values = layer.keys[:, :, drop:], layer.values[:, :, drop:]
    store = hf_index_keys(cache)
    for key, value in store.items():
        store[key] = value[:, drop:]


def check_batchable(model) -> None:
    """Raise :class:`BatchError` when ``model``'s KV caches cannot join a running batch (sliding window)."""
    if isinstance(backend_for(model), HFBackend):
        from dsv32.engine.hfcache import full_attention

        if not full_attention(model.config):
            raise BatchError(_SLIDING)


# ---------------------------------------------------------------------------------- the batch
@dataclass
class Prefilled:
    """Prompts' rows, prefilled together, ready to join a batch (:meth:`RunningBatch.join`)."""

    cache: object
    mask: torch.Tensor  # [rows, P], left-padded
    logits: torch.Tensor  # [rows, V]
    budgets: list[int]  # per row


class RunningBatch:
    """The rows decoding together over one cache. ``logits`` ``[B, V]``: each row's next-token logits.

    ``budgets[i]`` is how many more tokens row ``i`` may still generate; the native cache is sized so
    that no row outgrows it.
    """

    def __init__(self, model) -> None:
        self.model = model
        self.backend: NativeBackend | HFBackend = backend_for(model)
        self.native = isinstance(self.backend, NativeBackend)
        self.pad_token_id = self.backend.pad_token_id if self.backend.pad_token_id is not None else 0
        self.mask: torch.Tensor | None = None  # [B, S]
        self.logits: torch.Tensor | None = None  # [B, V]
        self.budgets: list[int] = []

    @property
    def size(self) -> int:
        return len(self.budgets)

    @property
    def device(self) -> torch.device:
        return self.backend.device

    def add(self, prompt_ids: Sequence[int], copies: int, budget: int) -> None:
        """Prefill ``prompt_ids`` and append ``copies`` rows for it, each allowed ``budget`` new tokens."""
        self.join(self.prefill(prompt_ids, copies, budget))

    def prefill(
        self, prompt_ids: Sequence[int], copies: int, budget: int, prefix: PrefixStore | None = None
    ) -> Prefilled:
        """``prompt_ids`` prefilled alone for ``copies`` rows (see :meth:`prefill_many`)."""
        return self.prefill_many([prompt_ids], [copies], [budget], prefix)

    @torch.no_grad()
    def prefill_many(
        self,
        prompts: Sequence[Sequence[int]],
        copies: Sequence[int],
        budgets: Sequence[int],
        prefix: PrefixStore | None = None,
    ) -> Prefilled:
        """``prompts`` prefilled together (one left-padded forward) for ``copies[i]`` rows of prompt
        ``i``, each allowed ``budgets[i]`` new tokens, and checked against the batch's cache; the batch
        itself is unchanged, so a :class:`BatchError` or a failing forward here concerns only these
        prompts. With ``prefix``, each prompt's longest prefix held there is not run again and the
        prompts' entries are kept there."""
        if not prompts or len(copies) != len(prompts) or len(budgets) != len(prompts):
            raise BatchError(
                f"one copies and one budget per prompt: {len(prompts)} prompts, {len(copies)} copies, "
                f"{len(budgets)} budgets"
            )
        if any(not p for p in prompts):
            raise BatchError("a prompt needs at least one token")
        if any(c < 1 for c in copies) or any(b < 1 for b in budgets):
            raise BatchError(f"copies and budget must be >= 1, got {list(copies)} and {list(budgets)}")
        rows = [list(p) for p in prompts]
        ids, mask = pad_prompts(rows, self.pad_token_id, self.device)
        max_len = ids.shape[1] + max(budgets)
        fresh = backend_for(self.model)
        if prefix is not None and fresh.can_reuse_prefix:
            logits = prefix.prefill(fresh, rows, ids, mask, max_len=max_len)
            positions = list(range(len(rows)))
            prefix.capture(fresh, positions, positions, rows, ids.shape[1])
            prefix.commit()
        else:
            logits = fresh.prefill(ids, mask, max_len=max_len)  # [B, V]
        repeat = [i for i, c in enumerate(copies) for _ in range(c)]
        index = torch.tensor(repeat, dtype=torch.long, device=self.device)
        if repeat != list(range(len(rows))):
            fresh.drop_rows(index)
        if self.size and not self.native:
            _hf_check_merge(self.backend.cache, fresh.cache)
        return Prefilled(fresh.cache, mask[index], logits[index], [budgets[i] for i in repeat])

    def join(self, rows: Prefilled) -> None:
        """Merge prefilled ``rows`` into the batch: the shorter side is left-padded to the longer."""
        if self.size == 0:
            self.backend.cache, self.mask, self.logits = rows.cache, rows.mask, rows.logits
            self.budgets = list(rows.budgets)
            return
        S_old, P = self.mask.shape[1], rows.mask.shape[1]
        S = max(S_old, P)
        budgets = self.budgets + list(rows.budgets)
        if self.native:
            self.backend.cache = _native_merge(self.model, self.backend.cache, rows.cache, S + max(budgets))
        else:
            _hf_merge(self.backend.cache, rows.cache)
        self.budgets = budgets
        self.mask = torch.cat((_pad_seq(self.mask, 1, S - S_old), _pad_seq(rows.mask, 1, S - P)), dim=0)
        self.logits = torch.cat((self.logits, rows.logits), dim=0)

    def remove(self, keep: Sequence[int]) -> None:
        """Keep only rows ``keep`` (in that order); trim the columns no kept row uses."""
        if len(keep) == self.size:
            return
        if not keep:
            self.backend.cache, self.mask, self.logits, self.budgets = None, None, None, []
            return
        rows = torch.tensor(list(keep), dtype=torch.long, device=self.device)
        self.backend.drop_rows(rows)
        self.mask, self.logits = self.mask[rows], self.logits[rows]
        self.budgets = [self.budgets[i] for i in keep]
        drop = int(self.mask.any(0).long().argmax())  # leading columns that are padding in every row
        if drop:
            self.mask = self.mask[:, drop:]
            if self.native:
                self.backend.cache.drop_front(drop)
            else:
                _hf_trim(self.backend.cache, drop)

    def keep(self, prefix: PrefixStore, positions: Sequence[int], ids: Sequence[Sequence[int]]) -> None:
        """Keep in ``prefix`` the entries of rows ``positions``, which hold the tokens ``ids`` (every
        token a row was fed: its prompt and its reply except the token sampled last)."""
        if not positions or not self.backend.can_reuse_prefix:
            return
        held = self.mask[list(positions)].sum(1).tolist()
        if held != [len(i) for i in ids]:
            raise BatchError(f"rows hold {held} tokens, not the {[len(i) for i in ids]} given")
        prefix.capture(
            self.backend, list(positions), list(positions), [list(i) for i in ids], self.mask.shape[1]
        )
        prefix.commit()

    @torch.no_grad()
    def step(self, tokens: Sequence[int]) -> None:
        """Append one token per row (``tokens[i]`` for row ``i``) and compute the next logits."""
        if len(tokens) != self.size:
            raise BatchError(f"step needs one token per row: {self.size} rows, {len(tokens)} tokens")
        if any(b < 1 for b in self.budgets):
            raise BatchError("a row without token budget is still in the batch; remove it first")
        tok = torch.tensor(list(tokens), dtype=torch.long, device=self.device)
        self.mask = torch.cat((self.mask, torch.ones_like(self.mask[:, :1])), dim=1)
        self.logits = self.backend.step(tok, self.mask)
        self.budgets = [b - 1 for b in self.budgets]


def sample_rows(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
    logprobs: bool = False,
    errors: dict[int, Exception] | None = None,
    allowed: torch.Tensor | None = None,
) -> tuple[list[int], torch.Tensor | None]:
    """Sample row ``i`` of ``logits`` ``[B, V]`` with ``params[i]`` and ``generators[i]``, among the
    tokens ``allowed[i]`` allows (a constraint's mask ``[B, V]``; None: every token).

    Returns ``(tokens, logprobs [B, V])``: the sampled ids and, when ``logprobs``, the model's
    untruncated ``log_softmax(logits)`` (what OpenAI-style ``logprobs`` report, independent of sampling
    settings and constraints; None otherwise). One batched argmax serves the greedy rows; the ids reach
    the host in one copy. With ``errors`` given, a row whose sampling raises gets its exception there
    (and token -1) instead of failing every row.
    """
    logits = logits.float()
    raw = logits.log_softmax(-1) if logprobs else None
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    tokens = logits.argmax(dim=-1)  # the greedy rows' tokens; the others are sampled below
    for i, (p, g) in enumerate(zip(params, generators, strict=True)):
        if p.greedy and (allowed is None or bool(torch.isfinite(logits[i]).any())):
            continue
        try:
            row = logits[i : i + 1]
            if allowed is None:
                tokens[i] = sample_next(row, p, g)[0][0]
            else:
                tokens[i] = sample_next(row, p, g, allowed[i : i + 1])[0][0]
        except Exception as err:  # one row's logits (NaN from the model) must not cost the others theirs
            if errors is None:
                raise
            errors[i] = err
            tokens[i] = -1
    return tokens.tolist(), raw
