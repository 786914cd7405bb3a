"""Next-token sampling that records what RL needs: the sampling log-probability of each token and,
optionally, the kept token set (Keep Sampling Mask, paper §3.1).

``temperature == 0`` is greedy. Otherwise logits are divided by the temperature, truncated to the
``top_k`` most likely tokens and to the smallest set whose probability reaches ``top_p`` (the most
likely token is always kept), renormalized over the kept set, and sampled. The returned log-prob is
that of the distribution actually sampled from — π_old over the kept set, which is exactly what the
trainer must renormalize π_θ against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SamplingParams:
    """``temperature`` 0 = greedy; ``top_p`` 1.0 and ``top_k`` 0 disable truncation."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def kept_mask(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Boolean ``[B, V]``: tokens that survive top-k and top-p truncation of ``logits / temperature``."""
    B, V = logits.shape
    keep = torch.ones(B, V, dtype=torch.bool, device=logits.device)
    if params.top_k and params.top_k < V:
        kth = logits.topk(params.top_k, dim=-1).values[:, -1:]
        keep &= logits >= kth
    if params.top_p < 1.0:
        scaled = (logits / params.temperature).masked_fill(~keep, float("-inf"))
        probs, order = scaled.softmax(dim=-1).sort(dim=-1, descending=True)
        # keep a token if the mass strictly before it is < top_p (so the top token is always kept)
        before = probs.cumsum(dim=-1) - probs
        keep_sorted = before < params.top_p
        keep &= torch.zeros_like(keep).scatter(-1, order, keep_sorted)
    return keep


def sample_next(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``logits`` ``[B, V]`` → ``(tokens [B], logprobs [B], kept [B, V] or None)``.

    Greedy returns the log-prob under the untruncated model distribution and ``kept = None``.
    """
    logits = logits.float()
    if params.greedy:
        logp = logits.log_softmax(dim=-1)
        tokens = logits.argmax(dim=-1)
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1), None
    keep = kept_mask(logits, params)
    logp = (logits / params.temperature).masked_fill(~keep, float("-inf")).log_softmax(dim=-1)
    tokens = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1), keep
