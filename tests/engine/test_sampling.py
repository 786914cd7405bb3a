"""Sampling truncation (top-k / top-p), its fast path against the reference, and the Keep Sampling Mask
contract: the returned log-probs are π_old renormalized over exactly the returned kept ids."""

from __future__ import annotations

import math

import pytest
import torch

from dsv32.engine import SamplingParams, kept_logprobs, kept_mask, sample_next, truncate


def random_logits(B=6, V=300, scale=3.0, seed=0):
    return torch.randn(B, V, generator=torch.Generator().manual_seed(seed)) * scale


def test_top_k_and_top_p_truncation():
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    assert kept_mask(logits, SamplingParams(top_k=2)).tolist() == [[True, True, False, False, False]]
    # mass before each token: 0, .5, .7, .85, .95 -> top_p=0.8 keeps the first three
    assert kept_mask(logits, SamplingParams(top_p=0.8)).tolist() == [[True, True, True, False, False]]
    assert kept_mask(logits, SamplingParams(top_p=0.01)).tolist() == [[True, False, False, False, False]]
    assert truncate(logits, SamplingParams(top_p=0.8))[0].tolist() == [[0, 1, 2]]
    tok, logp, kept = sample_next(logits, SamplingParams(top_p=0.8), torch.Generator().manual_seed(1))
    assert tok.item() in kept[0].tolist()
    assert math.isclose(logp.exp().item(), [0.5, 0.2, 0.15][tok.item()] / 0.85, rel_tol=1e-5)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, top_p=0.9),
        SamplingParams(temperature=0.7, top_p=0.5, top_k=40),
        SamplingParams(temperature=1.3, top_p=0.99, top_k=7),
        SamplingParams(temperature=0.6, top_k=12),
        SamplingParams(temperature=1.0, top_p=0.97),
    ],
)
@pytest.mark.parametrize("scale", [0.05, 3.0])  # nearly flat (wide kept sets) and peaky rows
def test_fast_truncation_equals_the_reference_mask(params, scale):
    logits = random_logits(B=7, V=2000, scale=scale)
    ids, vals = truncate(logits, params)
    ref = kept_mask(logits, params)
    counts = ref.sum(-1)
    assert ids.shape == (7, int(counts.max()))  # K = the largest kept set, -1 padded
    assert ids.dtype == torch.long
    for b in range(7):
        n = int(counts[b])
        assert torch.equal(ids[b, :n].sort().values, ref[b].nonzero().flatten())
        assert (ids[b, n:] == -1).all() and torch.isinf(vals[b, n:]).all()
        row = logits[b] / params.temperature
        assert torch.equal(vals[b, :n], row[ids[b, :n]])  # exact scaled logits, most likely first
        assert (vals[b, : n - 1] >= vals[b, 1:n]).all()
    if params.top_k:
        assert ids.shape[1] <= params.top_k


def test_flat_rows_widen_the_top_p_window_past_the_first_guesses():
    logits = random_logits(B=3, V=5000, scale=0.01)
    logits[0] = -20.0
    logits[0, 17] = 20.0  # one peaky row next to flat ones: K is the flat rows' count
    ids, _ = truncate(logits, SamplingParams(top_p=0.95))
    ref = kept_mask(logits, SamplingParams(top_p=0.95))
    assert ids.shape[1] == int(ref.sum(-1).max()) > 4000
    assert ids[0, 0] == 17 and (ids[0, 1:] == -1).all()


@pytest.mark.parametrize(
    "params", [SamplingParams(0.8, 0.9), SamplingParams(1.0, 0.95, 50), SamplingParams(0.7)]
)
def test_logprobs_are_the_kept_renormalization_exactly(params):
    """What the RL trainer recomputes from the kept ids, log_softmax(logits / T) restricted to them,
    gives the returned log-prob bit for bit."""
    logits = random_logits(B=16, V=1000, scale=2.0, seed=3)
    tok, logp, kept = sample_next(logits, params, torch.Generator().manual_seed(0))
    at = (kept == tok[:, None]).int().argmax(-1, keepdim=True)  # the token's place in its kept set
    assert (kept.gather(-1, at).squeeze(-1) == tok).all()
    recomputed = kept_logprobs(logits, kept, params.temperature)
    assert torch.equal(recomputed.gather(-1, at).squeeze(-1), logp)
    # the same by hand over the whole vocabulary: -inf outside the kept set
    B, V = logits.shape
    mask = torch.zeros(B, V + 1, dtype=torch.bool).scatter(-1, kept.where(kept >= 0, V), True)[:, :V]
    by_hand = (logits / params.temperature).masked_fill(~mask, float("-inf")).log_softmax(-1)
    torch.testing.assert_close(by_hand.gather(-1, tok[:, None]).squeeze(-1), logp, rtol=0, atol=1e-6)
    assert torch.equal(mask, kept_mask(logits, params))
    # extra -1 padding (a larger K elsewhere in the batch) changes nothing
    padded = torch.nn.functional.pad(kept, (0, 5), value=-1)
    torch.testing.assert_close(
        kept_logprobs(logits, padded, params.temperature)[:, : kept.shape[1]], recomputed
    )
    assert (logp < 0).all()


def test_kept_logprobs_are_differentiable_and_finite_for_empty_sets():
    logits = random_logits(B=2, V=50).requires_grad_()
    kept = torch.tensor([[3, 7, -1], [-1, -1, -1]], dtype=torch.int32)
    lp = kept_logprobs(logits, kept, 0.9)
    assert torch.isfinite(lp[1]).all() and torch.isinf(lp[0, 2])
    torch.testing.assert_close(lp[0, :2].exp().sum(), torch.tensor(1.0))
    lp[0, 0].backward()
    assert logits.grad[0, 3] != 0 and logits.grad[0, 7] != 0
    assert logits.grad[0].count_nonzero() == 2 and logits.grad[1].count_nonzero() == 0


def test_samples_follow_the_renormalized_distribution():
    logits = torch.log(torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])).expand(20000, 5)
    tok, logp, kept = sample_next(logits, SamplingParams(top_p=0.8), torch.Generator().manual_seed(0))
    freq = torch.bincount(tok, minlength=5).float() / len(tok)
    torch.testing.assert_close(freq, torch.tensor([0.5, 0.2, 0.15, 0, 0]) / 0.85, rtol=0, atol=0.015)
    assert kept.shape == (20000, 3)


def test_greedy_keeps_the_argmax_with_the_model_logprob():
    logits = random_logits(B=4, V=100)
    tok, logp, kept = sample_next(logits, SamplingParams(temperature=0.0))
    assert torch.equal(tok, logits.argmax(-1)) and torch.equal(kept, tok[:, None])
    torch.testing.assert_close(logp, logits.log_softmax(-1).gather(-1, tok[:, None]).squeeze(-1))


def test_sampling_with_a_seeded_generator_is_reproducible():
    logits = random_logits(B=8, V=500, scale=1.0)
    p = SamplingParams(temperature=1.0, top_p=0.95)
    a = sample_next(logits, p, torch.Generator().manual_seed(5))
    b = sample_next(logits, p, torch.Generator().manual_seed(5))
    c = sample_next(logits, p, torch.Generator().manual_seed(6))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-2)])
def test_bad_sampling_params(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


@pytest.mark.parametrize("temperature", [9e-6, 1e-38, 1e-40, 5e-324])
def test_a_temperature_below_greedy_below_decodes_greedily(temperature):
    """logits / 1e-40 overflows to inf in float32: such temperatures are greedy, with the model log-prob."""
    logits = random_logits(B=4, V=100)
    for top_p in (1.0, 0.9):
        params = SamplingParams(temperature=temperature, top_p=top_p, top_k=5)
        assert params.greedy
        tok, logp, kept = sample_next(logits, params, torch.Generator().manual_seed(0))
        assert torch.equal(tok, logits.argmax(-1)) and torch.equal(kept, tok[:, None])
        torch.testing.assert_close(logp, logits.log_softmax(-1).gather(-1, tok[:, None]).squeeze(-1))
        assert torch.equal(kept_mask(logits, params).nonzero()[:, 1], tok)
    assert not SamplingParams(temperature=1e-5).greedy


def _exact_top_p(logits, params):
    """float64 reference: in descending order, the top-k, then the smallest prefix whose mass reaches p."""
    values, order = (logits.double() / params.temperature).sort(dim=-1, descending=True)
    if params.top_k:
        values, order = values[:, : params.top_k], order[:, : params.top_k]
    before = torch.nn.functional.pad(values.softmax(-1).cumsum(-1)[:, :-1], (1, 0))
    return torch.zeros(logits.shape, dtype=torch.bool).scatter(-1, order, before < params.top_p)


def test_the_top_p_boundary_is_the_exact_smallest_prefix_that_reaches_top_p():
    """Thousands of rows, some with their boundary within float32's rounding of the cumulative mass."""
    torch.manual_seed(0)
    logits = torch.randn(500, 1000) * torch.linspace(0.5, 6.5, 500)[:, None]
    for temperature in (0.3, 1.7):
        for top_k in (0, 50):
            for top_p in (0.999, 0.9, 0.5):
                params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
                exact = _exact_top_p(logits, params)
                ids, _ = truncate(logits, params)
                ids = ids.masked_fill(ids < 0, logits.shape[1])  # padding goes to an extra column
                fast = torch.zeros(len(ids), logits.shape[1] + 1, dtype=torch.bool).scatter(-1, ids, True)
                fast = fast[:, :-1]
                assert torch.equal(fast, exact), (params, int((fast != exact).any(-1).sum()))
                assert torch.equal(kept_mask(logits, params), exact), params


def test_top_k_keeps_the_tokens_tied_with_the_kth_as_transformers_does():
    from transformers.generation.logits_process import TopKLogitsWarper

    logits = torch.tensor([[3.0, 2.0, 2.0, 2.0, 1.0, 0.0]])
    params = SamplingParams(top_k=2)
    assert truncate(logits, params)[0].sort().values.tolist() == [[0, 1, 2, 3]]
    assert kept_mask(logits, params).tolist() == [[True, True, True, True, False, False]]
    tok, logp, kept = sample_next(logits, params, torch.Generator().manual_seed(0))
    assert kept.shape == (1, 4) and tok.item() in kept[0].tolist()
    at = (kept == tok[:, None]).int().argmax(-1, keepdim=True)
    assert torch.equal(kept_logprobs(logits, kept, 1.0).gather(-1, at).squeeze(-1), logp)
    bf16 = random_logits(B=64, V=500, scale=2.0, seed=4).bfloat16().float()  # bf16 logits tie often
    for k, top_p in ((10, 1.0), (40, 1.0), (40, 0.9)):
        params = SamplingParams(temperature=0.8, top_p=top_p, top_k=k)
        ids, _ = truncate(bf16, params)
        ids = ids.masked_fill(ids < 0, 500)
        fast = torch.zeros(64, 501, dtype=torch.bool).scatter(-1, ids, True)[:, :-1]
        ref = kept_mask(bf16, params)
        # which of several equally likely tokens a top-p boundary cuts is arbitrary: compare their logits
        for row in range(64):
            assert torch.equal(bf16[row][fast[row]].sort().values, bf16[row][ref[row]].sort().values)
        if top_p == 1.0:
            assert torch.equal(fast, torch.isfinite(TopKLogitsWarper(k)(None, bf16.clone())))
            assert int(fast.sum(-1).max()) > k  # the case at hand: some row had a tie at the k-th
