"""Chunked lightning-indexer scoring with a streaming, exact top-k (the engine of
:func:`dsv32.dsa.indexer_topk`): memory ``O(chunk · window)``, never ``T × S``.

For a chunk of queries, the visible keys are scored in key blocks (two matmuls per block: the
``ReLU(q·k)`` logits of every indexer head, then their gated sum) into a reused row buffer; the row's
top-(k+1) is found coarse to fine and merged into a running top-(k+1) window by window. The extra
candidate detects rows whose k-th score ties an unselected key (frequent: ReLU makes exact zeros),
and only those rows are re-selected with the exact rule of :func:`dsv32.dsa.select_topk` — every key
above the k-th score, then the latest of the tied ones — so prefill, decode and any chunking select
the same set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from dsv32.dsa.topk import drop_extra_candidate, resolve_ties, row_topk

# Defaults of the chunked indexer (any value gives the same selection; these only trade speed and
# memory). Tuned on a 2-core AVX2 CPU with `python benchmarks/attention.py --tune`.
INDEXER_QUERY_CHUNK = 128  # queries scored together: the row buffer is chunk × visible keys (fp32)
INDEXER_BLOCK_ELEMS = 1 << 18  # logits per scoring block (chunk · H_I · key block), ~1 MB of fp32
INDEXER_KEY_BLOCK = 512  # smallest key block of a scoring step
INDEXER_TOPK_WINDOW = 1 << 15  # keys scored between two merges of the streaming top-k


@dataclass
class ChunkedSelector:
    """State of one :func:`dsv32.dsa.indexer_topk` call: fp32 ``keys`` ``[B, S, D]``, ``offset = S - T`` (query t sees
    keys ``<= t + offset``), ``padding`` ``[B, S]`` True = padded (or None)."""

    keys: torch.Tensor
    topk: int
    offset: int
    padding: torch.Tensor | None
    key_block: int
    window: int
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)

    def buffer(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """A contiguous fp32 work tensor reused across chunks (fresh pages cost more than the math)."""
        numel = math.prod(shape)
        buf = self.buffers.get(name)
        if buf is None or buf.numel() < numel:
            buf = self.buffers[name] = self.keys.new_empty(numel)
        return buf[:numel].view(shape)

    def score(self, q: torch.Tensor, w: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        """Index scores ``[B, n, hi - lo]`` of queries ``q`` ``[B, n, H, D]`` (gates ``w``) against
        keys ``lo .. hi - 1`` (no mask), in key blocks of ``~INDEXER_BLOCK_ELEMS`` logits. The result
        lives in a reused buffer: valid until the next call."""
        B, n, H, D = q.shape
        qv = q.reshape(B, n * H, D)
        wv = w.reshape(B, n, 1, H)
        width = hi - lo
        block = max(self.key_block, INDEXER_BLOCK_ELEMS // (n * H))
        out = self.buffer("rows", (B, n, width))
        for b0 in range(lo, hi, block):
            nb = min(b0 + block, hi) - b0
            logits = self.buffer("logits", (B, n * H, nb))
            torch.matmul(qv, self.keys[:, b0 : b0 + nb].transpose(1, 2), out=logits).relu_()
            if nb == width:  # one block: the gated head-sum writes the rows directly
                torch.matmul(wv, logits.view(B, n, H, nb), out=out.view(B, n, 1, nb))
            else:
                summed = self.buffer("summed", (B, n, 1, nb))
                torch.matmul(wv, logits.view(B, n, H, nb), out=summed)
                out[:, :, b0 - lo : b0 - lo + nb] = summed.view(B, n, nb)
        return out

    def mask(self, scores: torch.Tensor, lo: int, first_query: int) -> torch.Tensor:
        """Set invisible entries of ``scores`` ``[B, n, w]`` (keys ``lo ..``, queries
        ``first_query ..``) to -inf in place: padding, and the causal diagonal block only."""
        n, width = scores.shape[1:]
        if self.padding is not None:
            scores.masked_fill_(self.padding[:, lo : lo + width].unsqueeze(1), float("-inf"))
        # Keys up to first_query + offset are visible to every query of the chunk: no mask there.
        first_partial = first_query + self.offset + 1
        if first_partial < lo + width:
            c0 = max(first_partial, lo)
            cols = torch.arange(c0, lo + width, device=scores.device)
            rows = torch.arange(n, device=scores.device) + first_query + self.offset
            scores[:, :, c0 - lo :].masked_fill_(cols.unsqueeze(0) > rows.unsqueeze(1), float("-inf"))
        return scores

    def select(self, q: torch.Tensor, w: torch.Tensor, first_query: int) -> torch.Tensor:
        """``topk_indices`` ``[B, n, K]`` of queries ``first_query .. first_query + n - 1``."""
        B, n = q.shape[:2]
        K = self.topk
        visible = first_query + n + self.offset  # keys seen by the chunk's last query
        values = indices = None
        for lo in range(0, visible, self.window):
            hi = min(lo + self.window, visible)
            scores = self.mask(self.score(q, w, lo, hi), lo, first_query)
            v, i = row_topk(scores, min(K + 1, hi - lo))
            i += lo
            if values is not None:  # streaming merge with the running top-(k+1)
                v = torch.cat((values, v), dim=-1)
                v, j = v.topk(min(K + 1, v.shape[-1]), dim=-1, sorted=False)
                i = torch.cat((indices, i), dim=-1).gather(-1, j)
            values, indices = v, i
        if values.shape[-1] <= K:  # the chunk sees at most K keys: all visible ones are selected
            indices.masked_fill_(values == float("-inf"), -1)
            return F.pad(indices, (0, K - values.shape[-1]), value=-1)
        indices, ambiguous, low = drop_extra_candidate(values, indices, K)
        if bool(ambiguous.any()):
            single_window = visible <= self.window  # then `scores` holds every row's visible keys
            for b in ambiguous.any(dim=1).nonzero().flatten().tolist():
                rows = ambiguous[b].nonzero().flatten()
                if single_window:
                    row_scores = scores[b, rows]
                else:
                    row_scores = self.rescore(q[b, rows], w[b, rows], b, rows + first_query)
                indices[b, rows] = resolve_ties(row_scores, low[b, rows], K)
        return indices

    def rescore(self, q: torch.Tensor, w: torch.Tensor, b: int, t: torch.Tensor) -> torch.Tensor:
        """Masked scores ``[m, visible]`` of queries ``t`` ``[m]`` (``q`` ``[m, H, D]``) of batch row
        ``b`` over all keys the last of them sees."""
        visible = int(t.max()) + self.offset + 1
        plan = ChunkedSelector(self.keys[b : b + 1], self.topk, self.offset, None, self.key_block, visible)
        scores = plan.score(q.unsqueeze(0), w.unsqueeze(0), 0, visible)[0]
        hidden = torch.arange(visible, device=q.device).unsqueeze(0) > (t + self.offset).unsqueeze(1)
        if self.padding is not None:
            hidden |= self.padding[b, :visible].unsqueeze(0)
        return scores.masked_fill_(hidden, float("-inf"))
