"""Next-token sampling that records what RL needs: the sampling log-probability of each token and the
kept token set (Keep Sampling Mask, paper §3.1).

A temperature below ``GREEDY_BELOW`` (1e-5, vLLM's threshold; 0 included) is greedy: sampling at it
is the argmax up to rounding, and ``logits / temperature`` overflows for the smallest ones. Otherwise
logits are divided by the temperature, truncated to the ``top_k`` most likely tokens (and those
tied with the k-th, as transformers and vLLM keep them) and to the smallest set whose probability
reaches ``top_p`` (the most likely token is always kept),
renormalized over the kept set, and sampled. The returned log-prob is that of the distribution
actually sampled from — π_old over the kept set — and the kept ids are returned with it, so that the
trainer renormalizes π_θ over exactly the same action subspace:
:func:`kept_logprobs` is that renormalization, the same computation the sampler makes.

Under a constraint (:mod:`dsv32.engine.constraint`) the tokens a grammar does not allow are masked out
(``allowed``) before anything else: greedy decoding and top-k/top-p then see the constrained
distribution, and the kept set is the allowed tokens ∩ the top-k/top-p set of that distribution — a
constrained step is a truncation like top-p, so the trainer's renormalization over the kept ids is
again exactly the distribution sampled from.

:func:`kept_mask` is the readable reference (a ``[B, V]`` mask from one full sort);
:func:`truncate` is the fast path :func:`sample_next` uses (a partial ``topk``, widened only for the rows
that need more tokens to reach ``top_p``), and returns the kept ids directly, most likely first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from dsv32.recipe import NON_NEGATIVE, OPEN_UNIT, Checked, Rule

FIRST_WINDOW = 256  # tokens the top-p search looks at first; widened 8x for rows that need more
GREEDY_BELOW = 1e-5  # temperatures below this decode greedily (dividing by them can overflow)


@dataclass
class SamplingParams(Checked):
    """``temperature`` 0 (or below ``GREEDY_BELOW``) = greedy; ``top_p`` 1.0 and ``top_k`` 0 disable
    truncation."""

    RANGES: ClassVar[dict[str, Rule]] = {
        "temperature": NON_NEGATIVE,
        "top_p": OPEN_UNIT,
        "top_k": NON_NEGATIVE,
    }

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


def _mass_before(probs: torch.Tensor) -> torch.Tensor:
    """Exclusive cumulative sum along the last dim (monotone, so a threshold on it keeps a prefix)."""
    return F.pad(probs.cumsum(dim=-1)[..., :-1], (1, 0))


def _top_p_count(sorted_logprobs: torch.Tensor, top_p: float) -> torch.Tensor:
    """``[B]`` size of the kept prefix of ``[B, n]`` float64 log-probs in descending order (a float32
    sum of 10^5 probabilities is off by ~1e-6, enough to move the boundary by a token)."""
    return (_mass_before(sorted_logprobs.exp()) < top_p).sum(-1)


def _top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids [B, W], count [B])``: each row's tokens whose logit is at least its k-th largest, most
    likely first, -1-padded to the widest row (a tie with the k-th would otherwise be dropped at random)."""
    vals, ids = logits.topk(k, dim=-1)
    count = (logits >= vals[:, -1:]).sum(-1)
    width = int(count.max())
    if width > k:
        ids = logits.topk(width, dim=-1).indices
    return ids.masked_fill(torch.arange(width, device=ids.device) >= count[:, None], -1), count


def kept_mask(
    logits: torch.Tensor, params: SamplingParams, allowed: torch.Tensor | None = None
) -> torch.Tensor:
    """Reference: boolean ``[B, V]``, the tokens that survive top-k (ties with the k-th included) and
    then top-p truncation of ``logits / temperature``. A token is kept if the probability mass strictly
    before it (in descending order) is below ``top_p``, so the most likely token always is. Greedy:
    the argmax. ``allowed`` ``[B, V]`` (a constraint): the other tokens are masked out first and never kept."""
    if allowed is not None:
        return _kept_mask(logits.float().masked_fill(~allowed, float("-inf")), params) & allowed
    return _kept_mask(logits, params)


def _kept_mask(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    B, V = logits.shape
    if params.greedy:
        return torch.zeros(B, V, dtype=torch.bool, device=logits.device).scatter(
            -1, logits.argmax(-1, keepdim=True), True
        )
    keep = torch.ones(B, V, dtype=torch.bool, device=logits.device)
    if params.top_k and params.top_k < V:
        keep = logits >= logits.topk(params.top_k, dim=-1).values[:, -1:]
    if params.top_p < 1.0:
        scaled = (logits.double() / params.temperature).masked_fill(~keep, float("-inf"))
        order = scaled.argsort(dim=-1, descending=True)  # by logit: equal probabilities stay ordered
        probs = scaled.softmax(dim=-1).gather(-1, order)
        keep &= torch.zeros_like(keep).scatter(-1, order, _mass_before(probs) < params.top_p)
    return keep


def truncate(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Fast top-k/top-p truncation of ``logits`` ``[B, V]`` (not greedy).

    Returns ``(kept_ids [B, K], kept_logits [B, K])``: the kept token ids, most likely first, padded
    with -1 to K = the largest kept set in the batch, and ``logits / temperature`` at those ids (-inf
    at padding). Without truncation the kept set is the whole vocabulary in id order (K = V). Where
    the kept mass reaches ``top_p`` is decided in float64, as in :func:`kept_mask`.
    """
    scaled = logits.float() / params.temperature
    B, V = scaled.shape
    limit = params.top_k if 0 < params.top_k < V else V
    if limit < V:
        ids, ties = _top_k(logits.float(), limit)
        vals = scaled.gather(-1, ids.clamp_min(0)).masked_fill(ids < 0, float("-inf"))
        if params.top_p >= 1.0:
            return ids, vals
    elif params.top_p >= 1.0:
        return torch.arange(V, device=scaled.device).expand(B, V), scaled
    exact = logits.double() / params.temperature
    if limit < V:  # top-p inside the top-k set: its probabilities are normalized over the set
        top = exact.gather(-1, ids.clamp_min(0)).masked_fill(ids < 0, float("-inf"))
        count = _top_p_count(top - top.logsumexp(-1, keepdim=True), params.top_p).minimum(ties)
    else:  # a partial top-k, widened only for the rows whose kept prefix does not end inside it
        log_norm = exact.logsumexp(-1, keepdim=True)
        window = min(V, FIRST_WINDOW)
        vals, ids = scaled.topk(window, dim=-1)
        count = _top_p_count(exact.gather(-1, ids) - log_norm, params.top_p)
        short = count == window
        while window < V and bool(short.any()):
            window = min(V, 8 * window)
            rows = short.nonzero().squeeze(1)
            wide_vals, wide_ids = scaled[rows].topk(window, dim=-1)
            vals = F.pad(vals, (0, window - vals.shape[1]), value=float("-inf"))
            ids = F.pad(ids, (0, window - ids.shape[1]), value=-1)
            vals[rows], ids[rows] = wide_vals, wide_ids
            count[rows] = _top_p_count(exact[rows].gather(-1, wide_ids) - log_norm[rows], params.top_p)
            short = torch.zeros_like(short).index_fill(0, rows[count[rows] == window], True)
    K = int(count.max())
    pad = torch.arange(K, device=scaled.device) >= count[:, None]
    return ids[:, :K].masked_fill(pad, -1), vals[:, :K].masked_fill(pad, float("-inf"))


def kept_logprobs(logits: torch.Tensor, kept_ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """``log_softmax(logits / temperature)`` renormalized over ``kept_ids`` (Keep Sampling Mask).

    ``logits`` ``[..., V]``, ``kept_ids`` ``[..., K]`` (-1 = padding) → ``[..., K]`` log-probs, -inf at
    padding. Positions with no kept id at all (after a row finished) get a finite ``-log K``; mask them.
    Differentiable in ``logits``: this is π_θ over π_old's action subspace, for the trainer.
    """
    pad = kept_ids < 0
    vals = logits.float().gather(-1, kept_ids.long().clamp_min(0)) / temperature
    vals = vals.masked_fill(pad, float("-inf")).masked_fill(pad.all(-1, keepdim=True), 0.0)
    return vals.log_softmax(dim=-1)


def _only_allowed(ids: torch.Tensor, vals: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kept ``ids``/``vals`` ``[B, K]`` without the masked-out entries (-inf), order kept, -1-padded."""
    valid = (ids >= 0) & (vals > float("-inf"))
    count = valid.sum(-1)
    K = int(count.max())
    slot = torch.where(valid, valid.cumsum(-1) - 1, K)  # where each kept entry goes; the rest to column K
    out_ids = ids.new_full((ids.shape[0], K + 1), -1).scatter_(1, slot, ids)[:, :K]
    out_vals = vals.new_full((vals.shape[0], K + 1), float("-inf")).scatter_(1, slot, vals)[:, :K]
    return out_ids, out_vals


def sample_next(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    allowed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``logits`` ``[B, V]`` → ``(tokens [B], logprobs [B], kept_ids [B, K])``.

    Sampling: ``logprobs`` are those of the truncated, renormalized distribution, i.e. exactly
    ``kept_logprobs(logits, kept_ids, temperature)`` at the token; ``kept_ids`` as :func:`truncate`.
    Greedy: the kept set is the argmax alone (``K = 1``) and ``logprobs`` are the untruncated model
    log-probs ``log_softmax(logits)`` (renormalizing over one token would always give 0).
    ``allowed`` ``[B, V]`` bool (a constraint's mask): the other tokens are masked out before anything
    else, so the kept ids are allowed tokens only and ``logprobs`` those of the constrained distribution.
    """
    logits = logits.float()
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
        if not bool(torch.isfinite(logits).any(-1).all()):
            raise ValueError("the constraint allows no token with a finite logit at this step")
    if params.greedy:
        tokens = logits.argmax(dim=-1)
        logp = logits.gather(-1, tokens[:, None]).squeeze(-1) - logits.logsumexp(dim=-1)
        return tokens, logp, tokens[:, None]
    kept_ids, kept_logits = truncate(logits, params)
    if allowed is not None:
        kept_ids, kept_logits = _only_allowed(kept_ids, kept_logits)
    logp = kept_logits.log_softmax(dim=-1)
    choice = torch.multinomial(logp.exp(), 1, generator=generator)
    return kept_ids.gather(-1, choice).squeeze(-1), logp.gather(-1, choice).squeeze(-1), kept_ids
