"""Prefix reuse across batched calls: a multi-turn batch that keeps its rows' KV entries samples what
it samples without them, while prefilling only what each prompt adds."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from helpers.engine import PREFIX_MODELS as MODELS  # noqa: E402
from helpers.engine import tiny_hf, tiny_llama, tiny_native  # noqa: E402

from dsv32.engine import generate  # noqa: E402
from dsv32.engine.prefix import PrefixCache  # noqa: E402


def conversation(model, turns: int, prefix: PrefixCache | None, *, eos: int, sample: bool):
    """``turns`` batched calls of four episodes (two share their first prompt, as a GRPO group's do):
    each next prompt is the previous prompt, the reply and a tool result of a different length per
    episode; one episode leaves after the first call."""
    vocab = model.config.vocab_size
    prompts = [[5, 9, 12, 40, 7, 3, 22], [5, 9, 12, 40, 7, 3, 22], [8, 4, 2], [60, 61, 62, 63, 64, 65]]
    outs = []
    for turn in range(turns):
        gens = (
            [torch.Generator().manual_seed(100 * turn + i) for i in range(len(prompts))] if sample else None
        )
        out = generate(
            model, prompts, max_new_tokens=9, temperature=0.9 if sample else 0.0, top_k=20 if sample else 0,
            eos_token_id=eos, pad_token_id=0, generator=gens, prefix=prefix, return_kept=sample,
        )  # fmt: skip
        outs.append(out)
        replies = [out.tokens[i, : out.lengths[i]].tolist() for i in range(len(prompts))]
        result = [
            [(3 * i + j + turn) % (vocab - 3) + 2 for j in range(2 + 3 * i)] for i in range(len(prompts))
        ]
        prompts = [p + r + t for p, r, t in zip(prompts, replies, result)]
        if turn == 0:
            prompts = prompts[:2] + prompts[3:]  # the third episode has finished
    return outs


@pytest.mark.parametrize("kind", sorted(MODELS))
@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
def test_a_kept_prefix_samples_what_a_full_prefill_samples(kind, sample):
    model = MODELS[kind]()
    eos = 1 if kind == "native" else 3
    plain = conversation(model, 3, None, eos=eos, sample=sample)
    prefix = PrefixCache()
    reused = conversation(model, 3, prefix, eos=eos, sample=sample)
    for a, b in zip(plain, reused, strict=True):
        assert torch.equal(a.tokens, b.tokens)
        assert torch.equal(a.lengths, b.lengths)
        assert torch.allclose(a.logprobs, b.logprobs, atol=1e-4)
        if sample:
            assert torch.equal(a.kept_token_ids, b.kept_token_ids)
    total = sum(int(o.attention_mask[:, : o.sequences.shape[1] - o.tokens.shape[1]].sum()) for o in reused)
    assert prefix.reused_tokens > 0
    assert prefix.prompt_tokens == total
    assert prefix.prefilled_tokens + prefix.reused_tokens == total
    assert prefix.prefilled_tokens < total / 2
    assert len(prefix.rows) == 3 and prefix.nbytes() > 0


def test_identical_first_prompts_prefill_once():
    model = tiny_llama()
    prefix = PrefixCache()
    prompt = list(range(10, 40))
    generate(model, [prompt] * 4, max_new_tokens=2, temperature=0.0, eos_token_id=[], prefix=prefix)
    assert prefix.prefilled_tokens == (len(prompt) - 1) + 4  # the shared part once, the last token per row
    assert prefix.reused_tokens == 3 * (len(prompt) - 1)


def test_an_unrelated_prompt_reuses_nothing_and_still_samples_right():
    model = tiny_llama()
    prefix = PrefixCache()
    generate(model, [[5, 6, 7, 8]], max_new_tokens=3, temperature=0.0, eos_token_id=[], prefix=prefix)
    other = [[90, 91, 92, 93, 94]]
    a = generate(model, other, max_new_tokens=5, temperature=0.0, eos_token_id=[], prefix=prefix)
    b = generate(model, other, max_new_tokens=5, temperature=0.0, eos_token_id=[])
    assert torch.equal(a.tokens, b.tokens)
    assert prefix.reused_tokens == 0


def test_routing_cannot_come_from_a_kept_prefix():
    with pytest.raises(ValueError, match="routing"):
        generate(tiny_native(), [[5, 6]], max_new_tokens=2, return_routing=True, prefix=PrefixCache())


def test_a_sliding_window_model_runs_without_reuse():
    model = tiny_hf("mistral", sliding_window=8)
    prefix = PrefixCache()
    outs = conversation(model, 2, prefix, eos=3, sample=False)
    assert prefix.reused_tokens == 0 and not prefix.rows
    assert outs[1].tokens.shape[0] == 3


def test_a_row_whose_kept_prefix_ends_early_does_not_make_every_row_rerun():
    # One episode's reply was re-tokenized differently from how it was sampled: its kept prefix
    # ends at its first prompt. Its extra tokens run first in a batch of their own, not as a chunk
    # every row of the batch runs.
    model = tiny_llama()
    first = [[10 + i, 20 + i, 30 + i, 40 + i] for i in range(6)]
    prefix = PrefixCache()
    out = generate(model, first, max_new_tokens=30, temperature=0.0, eos_token_id=[], prefix=prefix)
    replies = [out.tokens[i].tolist() for i in range(6)]
    second = [p + r + [7, 8] for p, r in zip(first, replies)]
    second[0] = (
        first[0] + [(t + 1) % 250 + 2 for t in replies[0]] + [7, 8]
    )  # differs from the first reply token
    before = prefix.prefilled_tokens
    a = generate(model, second, max_new_tokens=6, temperature=0.0, eos_token_id=[], prefix=prefix)
    b = generate(model, second, max_new_tokens=6, temperature=0.0, eos_token_id=[])
    assert torch.equal(a.tokens, b.tokens)
    assert torch.allclose(a.logprobs, b.logprobs, atol=1e-4)
    # five rows reuse all but their last 3 tokens; row 0 runs its 32 new tokens: far from 6 × 32
    assert prefix.prefilled_tokens - before <= 32 + 6 * 3


def test_kept_rows_are_released_once_a_prefill_has_copied_them():
    from dsv32.engine.backends import backend_for, pad_prompts

    model = tiny_llama()
    prefix = PrefixCache()
    out = generate(model, [[5, 6, 7, 8]], max_new_tokens=3, temperature=0.0, eos_token_id=[], prefix=prefix)
    assert len(prefix.rows) == 1
    prompt = [5, 6, 7, 8, *out.tokens[0].tolist(), 9]
    ids, mask = pad_prompts([prompt], 0)
    prefix.prefill(backend_for(model), [prompt], ids, mask, max_len=len(prompt) + 2)
    assert prefix.rows == [] and prefix.nbytes() == 0  # the entries live in the backend's cache now
    assert prefix.reused_tokens == len(prompt) - 2  # all but the last reply token and the new one
