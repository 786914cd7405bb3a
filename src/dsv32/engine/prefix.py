"""Prefix reuse across batched calls: a multi-turn rollout's next call prefills only what is new.

An agent's next prompt is its previous prompt, the reply, the tool results and what reopens the
turn, so a batched call of many episodes (:class:`dsv32.rl.agentic.batcher.LockstepBatcher`) would
otherwise run every conversation through the model again at every call. A :class:`PrefixCache`
keeps, after each :func:`~dsv32.engine.generate` call it is given to, the KV entries of every row
(its prompt and its reply except the last token, which was sampled but never run), by token ids.
The next call matches each prompt to the kept row sharing its longest prefix, and prefills the
batch from those entries:

- ``k_i``: the tokens of prompt ``i`` whose entries are kept (at most ``len_i - 1``: the last prompt
  token always runs, its logits start the reply); every row runs its last ``N`` prompt tokens in one
  batched forward (a row with fewer new tokens re-runs some of its kept ones); the first
  ``c_i = len_i - N`` come from the kept entries. ``N`` is at least the new tokens of most rows (see
  the next point).
- The layout is :func:`~dsv32.engine.generate`'s own: every row's tokens a right-aligned suffix of
  ``P = max len_i`` columns, left padding masked, positions counted from the mask, so a row computes
  what it computes without reuse, up to the floating-point rounding of batched matmuls.
- Rows with many more new tokens than the others (an episode whose reply was re-tokenized
  differently from how it was sampled, so its kept prefix ends early) do not set ``N`` for all:
  their prompts except the last ``N`` tokens run first, in a smaller batch, and are kept.
- Identical prompts that match nothing kept (the G episodes of a task at their first call) are
  prefilled once: their unique prompts run first, and the duplicates reuse them.

Kept rows live until the next call has prefilled from them (a lockstep batch calls with every live
episode each time) and belong to the weights that computed them: a cache lives for one batch of episodes, never across a
weight update. Both kinds of model are handled (the native cache's MLA latents and indexer keys;
transformers' K/V per layer and, with DSA attached, the indexer keys beside them); MoE routing of
kept positions is not recorded again, so a call that asks for routing cannot take a prefix cache,
and a model whose cache cannot be cut per row (sliding-window layers) runs without reuse.

Counters: ``prompt_tokens`` (of every prompt given), ``prefilled_tokens`` (run through the model,
shared runs once) and ``reused_tokens``, the difference: the prefill work saved.

:class:`PrefixStore` is the same matching and prefill kept across calls and requests, as a server
keeps it (automatic prefix caching, as vLLM and SGLang do): kept rows stay until evicted, least
recently used first, so that the store's entries never take more than ``max_bytes``; a row whose
tokens begin another kept row's is dropped (the longer row serves every prompt the shorter one
did). Like a :class:`PrefixCache`, a store belongs to the weights that computed its entries:
whoever changes the weights clears it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dsv32.engine.backends import pad_prompts
from dsv32.engine.session import common_prefix


@dataclass(eq=False)
class KeptRow:
    """One row's KV entries: exactly ``len(ids)`` positions (backend-specific tensors, batch 1)."""

    ids: list[int]
    kv: dict

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in _tensors(self.kv))


class PrefixCache:
    """The kept rows of the last call (see the module docstring). Not thread-safe: one caller."""

    def __init__(self, *, dedupe: bool = True) -> None:
        self.dedupe = dedupe
        self.rows: list[KeptRow] = []
        self.prompt_tokens = 0
        self.prefilled_tokens = 0
        self._captured: dict[int, KeptRow] = {}

    @property
    def reused_tokens(self) -> int:
        return self.prompt_tokens - self.prefilled_tokens

    def clear(self) -> None:
        self.rows, self._captured = [], {}

    def nbytes(self) -> int:
        """Memory the kept entries take."""
        return sum(r.nbytes for r in self.rows)

    # ------------------------------------------------------------------------------ prefill
    def match(self, prompt: Sequence[int]) -> tuple[KeptRow | None, int]:
        """The kept row sharing the longest prefix with ``prompt`` and how many of its tokens serve
        (at most ``len(prompt) - 1``)."""
        best, k = None, 0
        for row in self.rows:
            n = common_prefix(row.ids, prompt)
            if n > k:
                best, k = row, n
        return best, min(k, len(prompt) - 1)

    def prefill(self, backend, prompts: list[list[int]], ids: torch.Tensor, mask: torch.Tensor, max_len: int):
        """Prefill the left-padded batch ``ids``/``mask`` (``prompts`` its rows as lists) on
        ``backend`` from the kept rows; the next-token logits ``[B, V]``."""
        self.prompt_tokens += sum(len(p) for p in prompts)
        logits = self._prefill(backend, prompts, ids, mask, max_len)
        self._prefilled()
        return logits

    def _prefilled(self) -> None:
        """After a prefill: the kept rows' entries are in the backend's cache now, and this call's rows
        replace them at :meth:`commit`, so they are released at once (a batch of long episodes would
        otherwise hold its KV entries twice through the whole call)."""
        self.rows = []

    def _prefill(self, backend, prompts, ids, mask, max_len):
        N = ids.shape[1]  # without reuse every row runs all of its tokens
        if backend.can_reuse_prefix:
            if self.dedupe:
                self._prefill_duplicates(backend, prompts)
            matches = [self.match(p) for p in prompts]
            new = [len(p) - k for p, (_, k) in zip(prompts, matches)]
            N = _chunk(new)
            stragglers = [i for i, n in enumerate(new) if n > N]
            if stragglers:  # the rows with more new tokens first run all but their last N
                self._extend(backend, [prompts[i][: len(prompts[i]) - N] for i in stragglers])
                for i in stragglers:
                    matches[i] = self.match(prompts[i])
        else:
            self.clear()
        self.prefilled_tokens += sum(min(len(p), N) for p in prompts)
        C = ids.shape[1] - N
        if C <= 0:  # nothing to reuse for the longest row: an ordinary prefill
            return backend.prefill(ids, mask, max_len=max_len)
        kept = [(row.kv, len(p) - N) if len(p) > N else (None, 0) for p, (row, _) in zip(prompts, matches)]
        return backend.prefill_kept(kept, C, ids[:, C:], mask, max_len=max_len)

    def _extend(self, backend, prompts: list[list[int]]) -> None:
        """Run ``prompts`` whole (from what is kept of them) on a fresh cache and keep them."""
        fresh = backend.fresh()
        ids, mask = pad_prompts(prompts, backend.pad_token_id or 0, backend.device)
        self._prefill(fresh, prompts, ids, mask, max_len=ids.shape[1] + 1)
        kvs = fresh.export_rows(list(range(len(prompts))), [len(p) for p in prompts], ids.shape[1])
        for p, kv in zip(prompts, kvs):
            self._add(KeptRow(list(p), kv))

    def _add(self, row: KeptRow) -> None:
        self.rows.append(row)

    def _prefill_duplicates(self, backend, prompts: list[list[int]]) -> None:
        """Prompts that occur more than once and match nothing kept: run each once (all but its last
        token) and keep it, so their copies reuse it."""
        seen: dict[tuple[int, ...], int] = {}
        for p in prompts:
            if len(p) > 1:
                seen[tuple(p)] = seen.get(tuple(p), 0) + 1
        unique = [list(p[:-1]) for p, n in seen.items() if n > 1 and self.match(p)[1] < len(p) - 1]
        if unique:
            self._extend(backend, unique)

    # ------------------------------------------------------------------------------ capture
    def capture(
        self, backend, positions: Sequence[int], rows: Sequence[int], ids: Sequence[list[int]], width: int
    ) -> None:
        """Keep the entries of batch rows ``rows`` (at ``positions`` of the backend's batch) holding
        the tokens ``ids`` (one list per row), the cache ``width`` columns wide (a backend that
        :attr:`can_reuse_prefix`)."""
        kvs = backend.export_rows(list(positions), [len(i) for i in ids], width)
        for row, tokens, kv in zip(rows, ids, kvs):
            self._captured[row] = KeptRow(list(tokens), kv)

    def commit(self) -> None:
        """The rows captured in this call become the kept rows (the previous ones are released)."""
        self.rows = [self._captured[r] for r in sorted(self._captured)]
        self._captured = {}


class PrefixStore(PrefixCache):
    """Kept rows across calls, at most ``max_bytes`` of entries, least recently used evicted first
    (see the module docstring). Not thread-safe: its users hold one lock around every call.

    ``hit_tokens`` / ``query_tokens`` is the hit rate: of the prompt tokens looked up, those whose
    entries came from the store (``reused_tokens``); ``evicted`` counts the rows evicted.
    """

    def __init__(self, max_bytes: int, *, dedupe: bool = True) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        super().__init__(dedupe=dedupe)
        self.max_bytes = int(max_bytes)
        self.evicted = 0
        self._bytes = 0

    @property
    def query_tokens(self) -> int:
        return self.prompt_tokens

    @property
    def hit_tokens(self) -> int:
        return self.reused_tokens

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    def nbytes(self) -> int:
        return self._bytes

    def _prefilled(self) -> None:
        """The kept rows stay: they serve the requests that follow."""

    def clear(self) -> None:
        """Forget every kept row (the weights changed); the counters stay."""
        super().clear()
        self._bytes = 0

    def match(self, prompt: Sequence[int]) -> tuple[KeptRow | None, int]:
        best, k = super().match(prompt)
        if best is not None and k > 0:  # most recently used last
            self.rows.remove(best)
            self.rows.append(best)
        return best, k

    def commit(self) -> None:
        """The rows captured in this call join the kept ones (instead of replacing them)."""
        captured, self._captured = [self._captured[r] for r in sorted(self._captured)], {}
        for row in captured:
            self._add(row)

    def _add(self, row: KeptRow) -> None:
        size = row.nbytes
        if size > self.max_bytes:  # never kept: it alone would exceed the bound
            return
        n = len(row.ids)
        covered = [r for r in self.rows if len(r.ids) >= n and r.ids[:n] == row.ids]
        if covered:  # a longer row already serves every prompt this one would
            self.rows.remove(covered[0])
            self.rows.append(covered[0])
            return
        for r in [r for r in self.rows if len(r.ids) < n and row.ids[: len(r.ids)] == r.ids]:
            self._drop(r)
        self.rows.append(row)
        self._bytes += size
        while self._bytes > self.max_bytes:
            self._drop(self.rows[0])
            self.evicted += 1

    def _drop(self, row: KeptRow) -> None:
        self.rows.remove(row)
        self._bytes -= row.nbytes


def _chunk(new: list[int]) -> int:
    """How many trailing tokens every row runs in the batched prefill, given each row's new tokens:
    the ``N`` that minimizes ``B·N`` plus the rows above it run first (``|S|·(max − N)``, one padded
    forward of the stragglers ``S``; theirs is planned the same way)."""
    B, top = len(new), max(new)
    return min(sorted(set(new)), key=lambda n: B * n + sum(1 for m in new if m > n) * (top - n))


def _tensors(kv) -> list[torch.Tensor]:
    """The tensors of a kept row's entries (nested dicts and lists)."""
    if isinstance(kv, torch.Tensor):
        return [kv]
    return [t for v in (kv.values() if isinstance(kv, dict) else kv) for t in _tensors(v)]
