"""Batched generation over a :class:`~dsv32.model.DeepseekV32` (with its sparse KV cache) or a
Hugging Face causal LM, with the records RL needs: sampling log-probs, kept token sets, MoE routing.

Prompts of different lengths are left-padded; padding is masked out of attention (and, for V3.2, of
the indexer's selection). One decode loop serves both kinds of model through a small backend
(:mod:`dsv32.engine.backends`: prefill and one-token step). Rows that reached EOS are dropped from the
model's batch when the backend allows it, so the remaining steps cost only the rows still generating.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dsv32.dsa.keep import IndexingError
from dsv32.engine.backends import backend_for, eos_ids, pad_prompts
from dsv32.engine.constraint import Constraint, allowed_rows
from dsv32.engine.prefix import PrefixCache
from dsv32.engine.sampling import SamplingParams, sample_next


@dataclass
class GenerationOutput:
    """Results of :func:`generate` for a batch of B prompts and up to N new tokens.

    - ``sequences`` ``[B, P + N]``: left-padded prompts followed by the new tokens;
    - ``attention_mask`` ``[B, P + N]``: 1 for prompt tokens and generated tokens up to EOS;
    - ``tokens`` ``[B, N]``: generated tokens (``pad_token_id`` after a row stopped);
    - ``logprobs`` ``[B, N]``: sampling log-probs (0 after stop): when sampling, those of the
      truncated, renormalized distribution that was sampled from (π_old over the kept set, see
      :mod:`dsv32.engine.sampling`); greedy: the model's untruncated ``log_softmax(logits)``;
    - ``lengths`` ``[B]``: generated tokens per row, EOS included;
    - ``routing`` ``[num_moe_layers, B, P + N - 1, k]`` expert indices of every position that was
      run through the model (the last token never is), if requested (native model only);
    - ``indexing`` ``[DSA layers, B, P + N - 1, index_topk]`` ``int32``, if requested (Keep Indexing):
      the keys every position run through the model attended to, as positions within its row
      (−1 empty; :mod:`dsv32.dsa.keep`), laid out like ``routing``;
    - ``kept_token_ids`` ``[B, N, K]`` ``int32``, if requested (Keep Sampling Mask): the token ids
      that survived top-k/top-p at each step, most likely first, -1-padded to K = the largest kept set
      in the batch (K <= ``top_k`` when it is set, plus the tokens tied with the k-th; 1 for greedy: the argmax; the whole vocabulary
      without truncation). All -1 after a row stopped. The sampled token is always among them, and
      ``kept_logprobs(logits, kept_token_ids, temperature)`` renormalizes π_θ over them.
    """

    sequences: torch.Tensor
    attention_mask: torch.Tensor
    tokens: torch.Tensor
    logprobs: torch.Tensor
    lengths: torch.Tensor
    routing: torch.Tensor | None = None
    kept_token_ids: torch.Tensor | None = None
    indexing: torch.Tensor | None = None


def _check_prompts(model, ids: torch.Tensor, mask: torch.Tensor, length: int) -> None:
    """Token ids the embedding has (a ValueError naming the first that is not); a warning when prompt +
    new tokens run past the positions the model was trained on."""
    config = getattr(model, "config", None)
    vocab = getattr(config, "vocab_size", None)
    if vocab is not None:
        real = ids[mask.bool()]
        outside = real[(real < 0) | (real >= vocab)]
        if outside.numel():
            raise ValueError(
                f"prompt token id {int(outside[0])} is outside the model's vocabulary of {vocab} ids"
            )
    limit = getattr(config, "max_position_embeddings", None)
    if limit is not None and length > limit:
        warnings.warn(
            f"prompt + max_new_tokens = {length} positions, beyond the model's max_position_embeddings "
            f"({limit}): quality past it is not what the model was trained for",
            stacklevel=3,
        )


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
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    return_routing: bool = False,
    return_kept: bool = False,
    prefix: PrefixCache | None = None,
    return_indexing: bool = False,
    constraints: Sequence[Constraint | None] | None = None,
) -> GenerationOutput:
    """Generate up to ``max_new_tokens`` per prompt (``temperature`` below 1e-5: greedy) with ``model``, a
    :class:`~dsv32.model.DeepseekV32` or a transformers causal LM (``LlamaForCausalLM``, Qwen2/3, ...).

    ``input_ids``: a ``[B, P]`` tensor (with ``attention_mask`` for left padding; a row whose mask ends
    in 0, right padding, is a ``ValueError``) or a list of token
    lists of any lengths (an id outside the vocabulary is a ``ValueError``; prompt + ``max_new_tokens``
    past the model's ``max_position_embeddings`` warns). Stops a row at any of ``eos_token_id`` (default: the model's generation
    config's, else its config's; ``[]`` never stops), and the whole batch once every row stopped.
    ``pad_token_id`` (default: the config's, else the first EOS, else 0) fills prompts and stopped rows.
    ``generator`` makes sampling reproducible: one for the batch, or one per prompt — the rows that
    share a generator object draw from it together, in row order, exactly as a call with those rows
    alone would (so a group of rows samples the same whatever else is in the batch). ``return_routing`` (V3.2 only) records MoE routing (Keep
    Routing); ``return_kept`` the kept token sets (Keep Sampling Mask); ``return_indexing`` the indexer's
    selections (Keep Indexing; DSA in sparse mode). ``constraints``: one per prompt (None: free), each
    the grammar the row's tokens must follow (:mod:`dsv32.engine.constraint`); its mask is applied
    before temperature/top-k/top-p, so the log-probs and kept sets are the constrained distribution's.
    See :class:`GenerationOutput`.
    """
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    backend = backend_for(model, return_routing, return_indexing)
    device = backend.device
    eos = eos_ids(backend.eos_token_id if eos_token_id is None else eos_token_id, device)
    if pad_token_id is None:
        pad_token_id = backend.pad_token_id
    if pad_token_id is None:
        pad_token_id = int(eos[0]) if len(eos) else 0
    ids, mask = pad_prompts(input_ids, pad_token_id, device)
    if attention_mask is not None:
        if attention_mask.shape != ids.shape:
            raise ValueError(
                f"attention_mask must have the shape of input_ids {tuple(ids.shape)}, "
                f"got {tuple(attention_mask.shape)}"
            )
        mask = attention_mask.to(device).long()
        ends_padded = (mask[:, -1] == 0).nonzero().flatten()
        if ends_padded.numel():  # the new tokens follow the last column: it must be the prompt's last token
            raise ValueError(
                f"attention_mask row {int(ends_padded[0])} ends with padding: generate continues every "
                'row after its last column, so pad on the left (tokenizer.padding_side = "left") '
                "or pass the prompts as lists of token ids"
            )
    B, P = ids.shape
    _check_prompts(model, ids, mask, P + max_new_tokens)
    per_row = generator is not None and not isinstance(generator, torch.Generator)
    if per_row and len(generator) != B:
        raise ValueError(f"generator: {len(generator)} generators for {B} prompts (one per prompt, or one)")
    if constraints is not None and len(constraints) != B:
        raise ValueError(
            f"constraints: {len(constraints)} for {B} prompts (one per prompt, None for a free one)"
        )

    if prefix is not None and return_routing:
        raise ValueError(
            "a prefix cache does not record the routing of kept positions: pass return_routing=False"
        )
    if prefix is not None and return_indexing:
        raise IndexingError(
            "a prefix cache does not record the selections of kept positions: pass return_indexing=False "
            "or no prefix cache"
        )
    keep_rows = prefix is not None and backend.can_reuse_prefix  # this call's rows are kept for the next
    if prefix is not None:
        rows_ids = [ids[i][mask[i].bool()].tolist() for i in range(B)]
        logits = prefix.prefill(backend, rows_ids, ids, mask, max_len=P + max_new_tokens)
    else:
        logits = backend.prefill(ids, mask, max_len=P + max_new_tokens)  # [B, V]
    rows = torch.arange(B, device=device)  # batch rows still in the model's batch
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    lengths = torch.zeros(B, dtype=torch.long, device=device)
    tokens, logprobs, kept = [], [], []
    for step in range(max_new_tokens):
        allowed = None
        if constraints is not None:  # a finished row still in the batch samples freely (its token is padding)
            live_constraints = [None if finished[i] else constraints[i] for i in rows.tolist()]
            allowed = allowed_rows(live_constraints, logits.shape[-1], device)
        if per_row and not params.greedy:
            gens = [generator[i] for i in rows.tolist()]
            tok, logp, keep = _sample_by_generator(logits, params, gens, allowed)
        else:
            gen = None if per_row else generator
            tok, logp, keep = sample_next(logits, params, gen, allowed)  # over `rows`
        live = ~finished  # rows for which this token is real (EOS included)
        if constraints is not None:
            for r, t in zip(rows.tolist(), tok.tolist()):
                if not finished[r] and constraints[r] is not None:
                    constraints[r].advance(t)
        tok = _scatter_rows(tok, rows, B, pad_token_id).masked_fill(finished, pad_token_id)
        tokens.append(tok)
        logprobs.append(_scatter_rows(logp, rows, B, 0.0).masked_fill(finished, 0.0))
        if return_kept:
            kept.append(_scatter_rows(keep.int(), rows, B, -1).masked_fill(finished[:, None], -1))
        lengths += live.long()
        finished |= torch.isin(tok, eos)
        mask = torch.cat((mask, live.long()[:, None]), dim=1)
        if step == max_new_tokens - 1 or bool(finished.all()):
            break
        if backend.can_drop_rows:
            still = ~finished[rows]
            if not bool(still.all()):
                if keep_rows:
                    gone = (~still).nonzero().squeeze(1).tolist()
                    _keep(prefix, backend, gone, rows, rows_ids, tokens, lengths, mask)
                backend.drop_rows(still.nonzero().squeeze(1))
                rows = rows[still]
        logits = backend.step(tok[rows], mask[rows])

    if keep_rows:
        _keep(prefix, backend, list(range(len(rows))), rows, rows_ids, tokens, lengths, mask)
    if prefix is not None:
        prefix.commit()
    new = torch.stack(tokens, dim=1)
    return GenerationOutput(
        sequences=torch.cat((ids, new), dim=1),
        attention_mask=mask,
        tokens=new,
        logprobs=torch.stack(logprobs, dim=1),
        lengths=lengths,
        routing=backend.recorded_routing(),
        kept_token_ids=_stack_kept(kept) if return_kept else None,
        indexing=backend.recorded_indexing(),
    )


def _keep(prefix, backend, positions, rows, prompts, tokens, lengths, mask) -> None:
    """Keep the entries of the rows at ``positions`` of the model's batch (``rows`` maps them to
    batch rows): each holds its prompt and its reply so far except the token sampled last."""
    batch_rows = [int(rows[p]) for p in positions]
    steps = torch.stack(tokens, dim=1)[batch_rows].tolist()
    n = lengths[batch_rows].tolist()
    ids = [prompts[r] + s[: k - 1] for r, s, k in zip(batch_rows, steps, n)]
    prefix.capture(backend, positions, batch_rows, ids, mask.shape[1] - 1)


def _sample_by_generator(
    logits: torch.Tensor,
    params: SamplingParams,
    generators: list[torch.Generator],
    allowed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`sample_next` of each set of rows that share a generator, on their own (their kept sets
    as wide as theirs alone), merged back in row order; kept ids −1-padded to the widest set."""
    sets: dict[int, list[int]] = {}
    for i, g in enumerate(generators):
        sets.setdefault(id(g), []).append(i)
    tok = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    logp = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    parts = []
    for rows in sets.values():
        idx = torch.tensor(rows, device=logits.device)
        t, lp, k = sample_next(
            logits[idx], params, generators[rows[0]], None if allowed is None else allowed[idx]
        )
        tok[idx], logp[idx] = t, lp.float()
        parts.append((idx, k))
    K = max(k.shape[1] for _, k in parts)
    keep = torch.full((logits.shape[0], K), -1, dtype=parts[0][1].dtype, device=logits.device)
    for idx, k in parts:
        keep[idx, : k.shape[1]] = k
    return tok, logp, keep


def _scatter_rows(values: torch.Tensor, rows: torch.Tensor, B: int, fill) -> torch.Tensor:
    """``values`` ``[b, *]`` of batch rows ``rows`` → ``[B, *]``, ``fill`` for the other rows."""
    if len(rows) == B:
        return values
    out = values.new_full((B, *values.shape[1:]), fill)
    out[rows] = values
    return out


def _stack_kept(kept: list[torch.Tensor]) -> torch.Tensor:
    """Per-step ``[B, K_t]`` kept ids → ``[B, N, K]``, -1-padded to the largest kept set recorded."""
    K = max(int((k >= 0).sum(-1).max()) for k in kept)
    return torch.stack(
        [torch.nn.functional.pad(k[:, :K], (0, K - min(K, k.shape[1])), value=-1) for k in kept], 1
    )
