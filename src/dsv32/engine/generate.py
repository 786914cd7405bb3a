"""Batched generation over a :class:`~dsv32.model.DeepseekV32` with its sparse KV cache.

Prefill writes the prompt's MLA latents and indexer keys into the cache; each decode step scores the
whole cache with the lightning indexer and attends to the selected ``index_topk`` latents only.
Prompts of different lengths are left-padded; padding is masked out of attention and selection.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dsv32.engine.sampling import SamplingParams, sample_next


@dataclass
class GenerationOutput:
    """Results of :func:`generate` for a batch of B prompts and up to N new tokens.

    - ``sequences`` ``[B, P + N]``: left-padded prompts followed by the new tokens;
    - ``attention_mask`` ``[B, P + N]``: 1 for prompt tokens and generated tokens up to EOS;
    - ``tokens`` ``[B, N]``: generated tokens (``pad_token_id`` after a row stopped);
    - ``logprobs`` ``[B, N]``: sampling log-probs (see :mod:`dsv32.engine.sampling`; 0 after stop);
    - ``lengths`` ``[B]``: generated tokens per row, EOS included;
    - ``routing`` ``[num_moe_layers, B, P + N - 1, k]`` expert indices of every position that was
      run through the model (the last token never is), if requested;
    - ``kept_token_ids``: per row, per step, the token ids kept by top-k/top-p, if requested.
    """

    sequences: torch.Tensor
    attention_mask: torch.Tensor
    tokens: torch.Tensor
    logprobs: torch.Tensor
    lengths: torch.Tensor
    routing: torch.Tensor | None = None
    kept_token_ids: list[list[torch.Tensor]] | None = None


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


@torch.no_grad()
def generate(
    model,
    input_ids: Sequence[Sequence[int]] | torch.Tensor,
    max_new_tokens: int = 32,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    *,
    attention_mask: torch.Tensor | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    generator: torch.Generator | None = None,
    return_routing: bool = False,
    return_kept: bool = False,
) -> GenerationOutput:
    """Generate up to ``max_new_tokens`` per prompt (``temperature=0``: greedy).

    ``input_ids``: a ``[B, P]`` tensor (with ``attention_mask`` for left padding) or a list of token
    lists of any lengths. Stops a row at any of ``eos_token_id`` (default: the model config's), and the
    whole batch once every row stopped.
    """
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
    cfg = model.config
    if eos_token_id is None:
        eos_token_id = cfg.eos_token_id
    eos = torch.as_tensor([] if eos_token_id is None else eos_token_id, dtype=torch.long).flatten()
    if pad_token_id is None:
        pad_token_id = cfg.pad_token_id if cfg.pad_token_id is not None else int(eos[0]) if len(eos) else 0
    device = model.lm_head.weight.device
    ids, mask = pad_prompts(input_ids, pad_token_id, device)
    if attention_mask is not None:
        mask = attention_mask.to(device).long()
    B, P = ids.shape
    eos = eos.to(device)

    cache = model.new_cache(B, P + max_new_tokens)
    out = model(ids, attention_mask=mask, cache=cache, logits_to_keep=1, return_routing=return_routing)
    tokens, logprobs, routing = [], [], [out.routing] if return_routing else None
    kept: list[list[torch.Tensor]] | None = [[] for _ in range(B)] if return_kept else None
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    lengths = torch.zeros(B, dtype=torch.long, device=device)
    for step in range(max_new_tokens):
        tok, logp, keep = sample_next(out.logits[:, -1], params, generator)
        live = ~finished  # rows for which this token is real (EOS included)
        tok = tok.masked_fill(finished, pad_token_id)
        tokens.append(tok)
        logprobs.append(logp.masked_fill(finished, 0.0))
        if kept is not None:
            for b in live.nonzero().flatten().tolist():
                # greedy keeps exactly the argmax (it is top-k with k = 1)
                kept[b].append(keep[b].nonzero().flatten() if keep is not None else tok[b : b + 1].clone())
        lengths += live.long()
        finished |= torch.isin(tok, eos)
        mask = torch.cat((mask, live.long()[:, None]), dim=1)
        if bool(finished.all()) or step == max_new_tokens - 1:
            break
        out = model(tok[:, None], attention_mask=mask, cache=cache, return_routing=return_routing)
        if routing is not None:
            routing.append(out.routing)

    new = torch.stack(tokens, dim=1)
    return GenerationOutput(
        sequences=torch.cat((ids, new), dim=1),
        attention_mask=mask,
        tokens=new,
        logprobs=torch.stack(logprobs, dim=1),
        lengths=lengths,
        routing=torch.cat(routing, dim=2) if routing and routing[0] is not None else None,
        kept_token_ids=kept,
    )
