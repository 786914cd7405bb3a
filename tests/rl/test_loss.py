"""The GRPO loss (paper §3.1, Eq. 5-9) against a token-by-token transcription, group advantages, and the
training side of Keep Sampling Mask against the engine's sampling log-probs."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv32.engine.sampling import SamplingParams, kept_mask
from dsv32.rl.grpo.loss import (
    OutputTotals,
    group_advantages,
    grpo_loss,
    kept_log_mass,
    sequence_kl_coefs,
    token_logprobs,
)

F64 = torch.float64
B, T = 5, 7
PADDED_ROW = 2
ADVANTAGES = [0.8, -0.6, 0.3, -1.2, -0.4]  # row 2 is fully padded


def reference(lp, old, A, mask, ref=None, samp=None, eps=0.2, beta=0.0, est="unbiased", delta=None):
    """-J of Eq. 8 written out with loops over sequences i and tokens t. Returns the loss (a 0-d tensor
    differentiable w.r.t. ``lp``), the number of sequences masked by Eq. 9, of clipped tokens, and the
    mean KL estimate."""
    seq_J, seq_kl, n_masked, n_clipped = [], [], 0, 0
    for i in range(lp.shape[0]):
        toks = [t for t in range(lp.shape[1]) if mask[i, t]]
        if not toks:
            continue
        beta_i = float(beta[i]) if torch.is_tensor(beta) else beta
        M = 1.0
        if delta is not None:  # Eq. 9 against the engine's log-probs (π_old when none are given)
            pi_s = samp if samp is not None else old
            divergence = sum(float(pi_s[i, t]) - float(lp[i, t].detach()) for t in toks) / len(toks)
            if float(A[i]) < 0 and divergence > delta:
                M, n_masked = 0.0, n_masked + 1
        J, kl_sum = 0.0, 0.0
        for t in toks:
            r = torch.exp(lp[i, t] - old[i, t])  # Eq. 6
            if r.detach() > 1 + eps:
                r_clip = torch.tensor(1 + eps, dtype=F64)
            elif r.detach() < 1 - eps:
                r_clip = torch.tensor(1 - eps, dtype=F64)
            else:
                r_clip = r
            pg = min(r * A[i], r_clip * A[i])
            n_clipped += int(r_clip.detach() * A[i] < r.detach() * A[i])
            kl = 0.0
            if ref is not None:
                q = torch.exp(ref[i, t] - lp[i, t])  # π_ref / π_θ
                k3 = q - torch.log(q) - 1
                kl = r * k3 if est == "unbiased" else k3  # Eq. 7
            J = J + pg * M - beta_i * kl
            kl_sum += float(kl.detach()) if torch.is_tensor(kl) else kl
        seq_J.append(J / len(toks))
        seq_kl.append(kl_sum / len(toks))
    if not seq_J:
        return torch.zeros((), dtype=F64), 0, 0, 0.0
    return -sum(seq_J) / len(seq_J), n_masked, n_clipped, sum(seq_kl) / len(seq_kl)


def make_batch(seed: int = 0, spread: float = 0.05):
    g = torch.Generator().manual_seed(seed)
    old = -3 * torch.rand(B, T, generator=g, dtype=F64) - 0.05
    lp = old + spread * torch.randn(B, T, generator=g, dtype=F64)
    ref = old + 0.3 * torch.randn(B, T, generator=g, dtype=F64)
    samp = old + 0.2 * torch.randn(B, T, generator=g, dtype=F64)
    mask = torch.rand(B, T, generator=g) < 0.7
    mask[:, 0] = True
    mask[PADDED_ROW] = False
    return lp, old, torch.tensor(ADVANTAGES, dtype=F64), mask, ref, samp


def divergences(lp, pi_s, mask):
    """{i: 1/|o_i| Σ_t (log π_sampling - log π_θ)} for the non-empty rows (Eq. 9's divergence)."""
    return {i: float((pi_s[i] - lp[i])[mask[i]].mean()) for i in range(B) if mask[i].any()}


def grad_of(loss_fn, lp):
    lp = lp.clone().requires_grad_()
    loss = loss_fn(lp)
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad


@pytest.mark.parametrize("with_samp", [False, True], ids=["old-as-sampling", "engine-sampling"])
@pytest.mark.parametrize("opsm", [None, "masks", "keeps-all"])
@pytest.mark.parametrize("kl", ["off", "unbiased", "k3", "per-seq"])
@pytest.mark.parametrize("clip", ["hit", "miss"])
def test_grpo_loss_matches_transcription(clip, kl, opsm, with_samp):
    spread, eps = (0.5, 0.1) if clip == "hit" else (0.05, 0.2)
    lp, old, A, mask, ref, samp = make_batch(seed=1, spread=spread)
    samp = samp if with_samp else None
    beta = {"off": 0.0, "unbiased": 0.3, "k3": 0.3, "per-seq": torch.tensor([0.0, 0.5, 0.1, 0.2, 1.0])}[kl]
    est = "k3" if kl == "k3" else "unbiased"
    ref = None if kl == "off" else ref
    delta = None
    if opsm is not None:
        d = divergences(lp, samp if with_samp else old, mask)
        negative = sorted(d_i for i, d_i in d.items() if ADVANTAGES[i] < 0)  # 3 rows: mask the top 2
        delta = (negative[0] + negative[1]) / 2 if opsm == "masks" else max(d.values()) + 1.0

    kwargs = dict(ref_logprobs=ref, sampling_logprobs=samp, clip_eps=eps, kl_coef=beta, kl_estimator=est)
    loss, grad = grad_of(lambda x: grpo_loss(x, old, A, mask, **kwargs, opsm_delta=delta)[0], lp)
    want, want_grad = grad_of(lambda x: reference(x, old, A, mask, ref, samp, eps, beta, est, delta)[0], lp)
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-12)

    _, metrics = grpo_loss(lp, old, A, mask, **kwargs, opsm_delta=delta)
    _, n_masked, n_clipped, kl_mean = reference(lp, old, A, mask, ref, samp, eps, beta, est, delta)
    n_seqs, n_tokens = B - 1, int(mask.sum())
    assert metrics["tokens"] == n_tokens
    assert metrics["opsm_masked_frac"] == pytest.approx(n_masked / n_seqs)
    assert (n_masked == 2) if opsm == "masks" else (n_masked == 0)
    assert metrics["clip_frac"] == pytest.approx(n_clipped / n_tokens)
    assert (n_clipped > 0) if clip == "hit" else (n_clipped == 0)
    assert metrics["kl"] == pytest.approx(kl_mean, rel=1e-12)
    assert metrics["pg_loss"] + metrics["kl_loss"] == pytest.approx(float(loss), rel=1e-12)
    r = (lp - old).exp()[mask]
    assert metrics["ratio_mean"] == pytest.approx(float(r.mean()))
    assert (metrics["ratio_min"], metrics["ratio_max"]) == pytest.approx((float(r.min()), float(r.max())))
    assert metrics["log_ratio_sampling"] == pytest.approx(
        sum(divergences(lp, samp if with_samp else old, mask).values()) / n_seqs
    )


def test_unbiased_kl_gradient_flows_through_the_ratio():
    """With A = 0 only the KL term acts. Per token, d/d log π_θ of r · K3 is r · log(π_θ/π_ref); with r
    detached it would be r · (1 - π_ref/π_θ), and plain K3 gives 1 - π_ref/π_θ."""
    lp, old, _, mask, ref, _ = make_batch(seed=2, spread=0.5)
    A, beta = torch.zeros(B, dtype=F64), 0.7
    lengths = mask.sum(-1, keepdim=True).clamp_min(1)
    scale = beta * mask.to(F64) / (lengths * (B - 1))  # d loss / d (per-token KL)
    r, q = (lp - old).exp(), (ref - lp).exp()

    _, grad = grad_of(lambda x: grpo_loss(x, old, A, mask, ref_logprobs=ref, kl_coef=beta)[0], lp)
    torch.testing.assert_close(grad, scale * r * (lp - ref), rtol=1e-10, atol=1e-14)
    assert not torch.allclose(grad, scale * r * (1 - q), rtol=1e-3)  # what a detached ratio would give

    _, grad_k3 = grad_of(
        lambda x: grpo_loss(x, old, A, mask, ref_logprobs=ref, kl_coef=beta, kl_estimator="k3")[0], lp
    )
    torch.testing.assert_close(grad_k3, scale * (1 - q), rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("estimator", ["unbiased", "k3"])
def test_unbiased_kl_is_unbiased_under_pi_old(estimator):
    """Exact expectation over a small vocabulary: one length-1 sequence per token v, weighted by
    π_old(v) through a per-sequence kl_coef, so the loss is E_{o~π_old}[KL estimate]. The unbiased
    estimator's value and gradient equal those of KL(π_θ || π_ref); plain K3's do not."""
    V = 6
    g = torch.Generator().manual_seed(3)
    theta, theta_old, theta_ref = (torch.randn(V, generator=g, dtype=F64) for _ in range(3))
    log_old, log_ref = theta_old.log_softmax(-1)[:, None], theta_ref.log_softmax(-1)[:, None]
    beta = V * log_old.exp().squeeze(-1)
    theta = theta.requires_grad_()
    lp = theta.log_softmax(-1)[:, None]
    mask, A = torch.ones(V, 1, dtype=torch.bool), torch.zeros(V, dtype=F64)
    loss, _ = grpo_loss(lp, log_old, A, mask, ref_logprobs=log_ref, kl_coef=beta, kl_estimator=estimator)
    (grad,) = torch.autograd.grad(loss, theta)

    theta_ = theta.detach().clone().requires_grad_()
    p = theta_.log_softmax(-1)
    true_kl = (p.exp() * (p - log_ref.squeeze(-1))).sum()
    (true_grad,) = torch.autograd.grad(true_kl, theta_)
    matches = torch.allclose(loss, true_kl, rtol=1e-10) and torch.allclose(grad, true_grad, rtol=1e-8)
    assert matches == (estimator == "unbiased")


def test_equal_rewards_give_zero_policy_gradient():
    rewards = torch.tensor([0.3, 0.3, 0.3, 0.3, 1.0, 0.0, 1.0, 0.0])
    for scale in ("none", "std"):
        A = group_advantages(rewards, group_size=4, scale=scale)
        assert torch.equal(A[:4], torch.zeros(4))
    lp, old, _, mask, _, _ = make_batch(seed=4, spread=0.5)
    A = group_advantages(torch.full((B,), 0.1, dtype=F64), group_size=B)
    loss, grad = grad_of(lambda x: grpo_loss(x, old, A, mask, opsm_delta=-1.0)[0], lp)
    assert float(loss) == 0.0 and torch.equal(grad, torch.zeros_like(grad))


def test_padding_values_never_leak():
    """Whatever sits at padded positions (here -inf and NaN) changes nothing; a padded row is left out."""
    lp, old, A, mask, ref, samp = make_batch(seed=5, spread=0.3)
    kwargs = dict(ref_logprobs=ref, sampling_logprobs=samp, kl_coef=0.2, opsm_delta=0.0)
    clean, clean_grad = grad_of(lambda x: grpo_loss(x, old, A, mask, **kwargs)[0], lp)
    dirty = [
        t.masked_fill(~mask, v)
        for t, v in [(lp, -math.inf), (old, math.nan), (ref, math.inf), (samp, math.nan)]
    ]
    kwargs.update(ref_logprobs=dirty[2], sampling_logprobs=dirty[3])
    loss, grad = grad_of(lambda x: grpo_loss(x, dirty[1], A, mask, **kwargs)[0], dirty[0])
    torch.testing.assert_close(loss, clean, rtol=0, atol=0)
    torch.testing.assert_close(grad, clean_grad, rtol=0, atol=0)
    assert torch.equal(grad[PADDED_ROW], torch.zeros(T, dtype=F64))


@pytest.mark.parametrize("batch", [B, 0])
def test_empty_batch_gives_zero_loss_that_backpropagates(batch):
    lp = torch.randn(batch, T, dtype=F64, requires_grad=True)
    mask = torch.zeros(batch, T)
    loss, metrics = grpo_loss(
        lp,
        lp.detach(),
        torch.ones(batch, dtype=F64),
        mask,
        ref_logprobs=lp.detach(),
        kl_coef=0.1,
        opsm_delta=0.0,
    )
    loss.backward()
    assert float(loss.detach()) == 0.0 and torch.equal(lp.grad, torch.zeros_like(lp))
    assert metrics["tokens"] == 0 and all(math.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(old_logprobs=torch.zeros(B, T + 1)), "old_logprobs must have shape \\[5, 7\\]"),
        (dict(mask=torch.ones(T, B)), "mask must have shape \\[5, 7\\]"),
        (dict(advantages=torch.zeros(B, 1)), "advantages must have shape \\[5\\]"),
        (dict(ref_logprobs=torch.zeros(B, 1), kl_coef=0.1), "ref_logprobs must have shape"),
        (dict(sampling_logprobs=torch.zeros(B)), "sampling_logprobs must have shape"),
        (dict(logprobs=torch.zeros(B, T, 2)), "logprobs must be a floating \\[B, T\\]"),
        (dict(kl_coef=torch.zeros(B + 1), ref_logprobs=torch.zeros(B, T)), "kl_coef must have shape \\[5\\]"),
        (dict(kl_coef=0.1), "ref_logprobs was not given"),
        (dict(kl_coef=-0.1, ref_logprobs=torch.zeros(B, T)), "kl_coef must be >= 0"),
        (dict(kl_coef=math.nan, ref_logprobs=torch.zeros(B, T)), "kl_coef must be >= 0 and not NaN"),
        (dict(clip_eps=math.nan), "clip_eps must be a number >= 0"),
        (dict(opsm_delta=math.nan, sampling_logprobs=torch.zeros(B, T)), "opsm_delta is NaN"),
        (dict(kl_estimator="k2"), "kl_estimator must be one of"),
        (dict(advantages=torch.tensor([0.0, math.nan, 0, 0, 0])), "advantages contain inf or NaN"),
    ],
)
def test_bad_inputs_are_rejected(kwargs, match):
    args = dict(
        logprobs=torch.zeros(B, T),
        old_logprobs=torch.zeros(B, T),
        advantages=torch.zeros(B),
        mask=torch.ones(B, T, dtype=torch.bool),
    )
    args.update(kwargs)
    positional = [args.pop(k) for k in ("logprobs", "old_logprobs", "advantages", "mask")]
    with pytest.raises(ValueError, match=match):
        grpo_loss(*positional, **args)


def test_group_advantages():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 4.0])
    torch.testing.assert_close(group_advantages(rewards, 3), torch.tensor([2 / 3, -1 / 3, -1 / 3, -2, 0, 2]))
    std = torch.tensor([1.0, 0.0, 0.0]).std(correction=0)  # population std
    torch.testing.assert_close(
        group_advantages(rewards, 3, "std")[:3], torch.tensor([2 / 3, -1 / 3, -1 / 3]) / (std + 1e-6)
    )
    assert group_advantages(torch.tensor([1, 0, 1, 1]), 2).dtype == torch.float32
    with pytest.raises(ValueError, match="not a multiple of group_size=4"):
        group_advantages(rewards, 4)
    with pytest.raises(ValueError, match="scale must be"):
        group_advantages(rewards, 3, scale="rank")
    torch.testing.assert_close(group_advantages([1.0, 0.0], 2), torch.tensor([0.5, -0.5]))  # a list works
    with pytest.raises(ValueError, match="group_size must be an integer"):
        group_advantages(rewards, 3.0)


def test_group_advantages_leave_out_members_without_a_reward():
    rewards = torch.tensor([1.0, 0.0, 0.0, 7.0, 3.0, 0.0, 0.0, 0.0])
    valid = [True, True, True, False, True, False, False, False]
    # group 1: the unscored member (its 7.0 means nothing) is out of the mean and gets zero advantage
    expected = group_advantages(torch.tensor([1.0, 0.0, 0.0]), 3)
    got = group_advantages(rewards, 4, valid=valid)
    torch.testing.assert_close(got[:3], expected)
    assert got[3] == 0
    assert torch.equal(got[4:], torch.zeros(4))  # one scored member left: nothing to compare it with
    std = group_advantages(rewards, 4, "std", valid=valid)
    torch.testing.assert_close(std[:3], group_advantages(torch.tensor([1.0, 0.0, 0.0]), 3, "std"))
    torch.testing.assert_close(group_advantages(rewards, 4, valid=[True] * 8), group_advantages(rewards, 4))
    with pytest.raises(ValueError, match="valid must be"):
        group_advantages(rewards, 4, valid=[True] * 4)


def test_sequence_kl_coefs():
    betas = sequence_kl_coefs(["math", "code", "chat"], {"code": 0.01, "chat": 0.1}, default=0.0)
    assert torch.equal(betas, torch.tensor([0.0, 0.01, 0.1]))
    for bad in (-1.0, math.nan):
        with pytest.raises(ValueError, match=">= 0"):
            sequence_kl_coefs(["math"], {"math": bad})


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), perm=st.permutations(range(B)))
def test_loss_is_invariant_to_permuting_sequences(seed, perm):
    lp, old, A, mask, ref, samp = make_batch(seed, spread=0.4)
    kwargs = dict(kl_coef=torch.linspace(0, 1, B, dtype=F64), opsm_delta=0.05)
    p = list(perm)
    loss, _ = grpo_loss(lp, old, A, mask, ref_logprobs=ref, sampling_logprobs=samp, **kwargs)
    kwargs["kl_coef"] = kwargs["kl_coef"][p]
    permuted, _ = grpo_loss(
        lp[p], old[p], A[p], mask[p], ref_logprobs=ref[p], sampling_logprobs=samp[p], **kwargs
    )
    torch.testing.assert_close(permuted, loss, rtol=1e-12, atol=1e-14)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10_000), delta=st.floats(-5, 5))
def test_opsm_never_masks_non_negative_advantages(seed, delta):
    lp, old, A, mask, _, samp = make_batch(seed, spread=1.0)
    A = A.abs() * torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0], dtype=F64)
    loss, metrics = grpo_loss(lp, old, A, mask, sampling_logprobs=samp, opsm_delta=delta)
    assert metrics["opsm_masked_frac"] == 0.0
    assert torch.equal(loss, grpo_loss(lp, old, A, mask, sampling_logprobs=samp)[0])


@settings(max_examples=30, deadline=None)
@given(rewards=st.lists(st.floats(-10, 10), min_size=6, max_size=6), shift=st.floats(-10, 10))
def test_group_advantages_are_centered_and_shift_invariant(rewards, shift):
    R = torch.tensor(rewards, dtype=F64)
    A = group_advantages(R, 3)
    torch.testing.assert_close(A.view(2, 3).sum(-1), torch.zeros(2, dtype=F64), rtol=0, atol=1e-12)
    torch.testing.assert_close(group_advantages(R + shift, 3), A, rtol=0, atol=1e-12)


# ---------------------------------------------------------------- outputs laid out in several rows
# An agentic episode (one output o_i) may be split into several rows: rows 0-1 and 3-4 below are one
# output each, so they share an advantage and a β.
IDS = torch.tensor([0, 0, 1, 2, 2])
OUTPUT_ADVANTAGES = [-0.6, -0.6, 0.3, 0.8, 0.8]
OUTPUT_BETAS = [0.5, 0.5, 0.0, 0.2, 0.2]


def output_batch(seed: int):
    lp, old, _, mask, ref, samp = make_batch(seed, spread=0.4)
    mask[PADDED_ROW, :3] = True  # the single-row output has tokens too
    A, beta = torch.tensor(OUTPUT_ADVANTAGES, dtype=F64), torch.tensor(OUTPUT_BETAS, dtype=F64)
    return lp, old, A, mask, ref, samp, beta


def joined(x: torch.Tensor) -> torch.Tensor:
    """The ``[5, ...]`` rows of :data:`IDS` as three rows, each output's rows end to end: ``[3, 2T]``."""
    pad = torch.zeros_like(x[0])
    return torch.stack([torch.cat([x[0], x[1]]), torch.cat([x[2], pad]), torch.cat([x[3], x[4]])])


def test_a_split_output_weighs_like_an_unsplit_one_and_opsm_decides_on_all_of_it():
    """G = 2: output 0 is one 10-token row, output 1 is a 2-token row and an 8-token row. Eq. 5 gives
    each output weight 1/G and each of its tokens 1/(G·|o_i|), whatever the rows."""
    mask = torch.zeros(3, 10, dtype=torch.bool)
    mask[0], mask[1, :2], mask[2, :8] = True, True, True
    samp = torch.zeros(3, 10, dtype=F64)
    samp[1, :2] = 2.0  # output 1: divergence 2.0 on its 2-token row, 0.4 over its 10 tokens
    A, ids = torch.tensor([0.5, -0.5, -0.5], dtype=F64), torch.tensor([0, 1, 1])
    zeros = torch.zeros(3, 10, dtype=F64)

    def grads(**kwargs):
        _, grad = grad_of(lambda x: grpo_loss(x, zeros, A, mask, sampling_logprobs=samp, **kwargs)[0], zeros)
        return grad.abs()

    g = grads(sequence_ids=ids)
    assert float(g[0].sum()) == pytest.approx(0.25) and float(g[1:].sum()) == pytest.approx(0.25)
    assert torch.allclose(g[mask], torch.full((20,), 0.025, dtype=F64))  # every token weighs the same
    per_row = grads()  # each row its own output: the split output weighs twice as much
    assert float(per_row[1:].sum()) == pytest.approx(2 * float(per_row[0].sum()))

    # Eq. 9 on the whole output: 0.4 < δ = 0.5 keeps it, though its 2-token row alone is at 2.0.
    assert torch.equal(grads(sequence_ids=ids, opsm_delta=0.5), g)
    _, m = grpo_loss(zeros, zeros, A, mask, sampling_logprobs=samp, opsm_delta=0.5, sequence_ids=ids)
    assert m["opsm_masked_frac"] == 0.0 and m["log_ratio_sampling"] == pytest.approx(0.2)
    # δ = 0.3 < 0.4 masks the output: both of its rows.
    masked = grads(sequence_ids=ids, opsm_delta=0.3)
    assert float(masked[0].sum()) == pytest.approx(0.25) and torch.equal(
        masked[1:], torch.zeros(2, 10, dtype=F64)
    )
    _, m = grpo_loss(zeros, zeros, A, mask, sampling_logprobs=samp, opsm_delta=0.3, sequence_ids=ids)
    assert m["opsm_masked_frac"] == 0.5


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), delta=st.floats(-1.0, 1.0), estimator=st.sampled_from(["unbiased", "k3"]))
def test_an_output_in_several_rows_is_the_same_output_in_one_row(seed, delta, estimator):
    """Loss, gradient and every metric of rows with sequence ids equal those of each output's rows
    laid end to end in one row (Eq. 5-9 see outputs, not rows)."""
    lp, old, A, mask, ref, samp, beta = output_batch(seed)
    kwargs = dict(kl_estimator=estimator, opsm_delta=delta)
    split = [old, A, mask]
    loss, grad = grad_of(
        lambda x: grpo_loss(x, *split, ref_logprobs=ref, sampling_logprobs=samp, kl_coef=beta,
                            sequence_ids=IDS, **kwargs)[0], lp,
    )  # fmt: skip
    one_row = [joined(old), A[[0, 2, 3]], joined(mask)]
    one = dict(ref_logprobs=joined(ref), sampling_logprobs=joined(samp), kl_coef=beta[[0, 2, 3]], **kwargs)
    want, want_grad = grad_of(lambda x: grpo_loss(x, *one_row, **one)[0], joined(lp))
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(joined(grad), want_grad, rtol=1e-10, atol=1e-14)
    _, metrics = grpo_loss(
        lp, *split, ref_logprobs=ref, sampling_logprobs=samp, kl_coef=beta, sequence_ids=IDS, **kwargs
    )
    _, want_metrics = grpo_loss(joined(lp), *one_row, **one)
    assert metrics == pytest.approx(want_metrics, rel=1e-12, abs=1e-14)


def test_distinct_sequence_ids_are_the_per_row_loss():
    """Every row an output of its own gives what ``sequence_ids=None`` gives: loss, gradient and
    metrics bit for bit when the ids increase with the rows (outputs are summed in id order), up to
    the order of a float sum otherwise."""
    lp, old, A, mask, ref, samp = make_batch(seed=6, spread=0.4)
    kwargs = dict(ref_logprobs=ref, sampling_logprobs=samp, kl_coef=torch.linspace(0, 1, B, dtype=F64))
    d = sorted(divergences(lp, samp, mask).values())
    kwargs["opsm_delta"] = (d[1] + d[2]) / 2  # masks some rows (those with A < 0), keeps others

    def run(ids):
        loss, grad = grad_of(lambda x: grpo_loss(x, old, A, mask, **kwargs, sequence_ids=ids)[0], lp)
        return loss, grad, grpo_loss(lp, old, A, mask, **kwargs, sequence_ids=ids)[1]

    loss, grad, metrics = run(None)
    assert metrics["opsm_masked_frac"] > 0
    for ids in (torch.arange(B), torch.tensor([-3, 0, 7, 10, 99])):
        got = run(ids)
        assert torch.equal(got[0], loss) and torch.equal(got[1], grad) and got[2] == metrics
    got = run(torch.tensor([10, -3, 7, 0, 99]))
    torch.testing.assert_close(got[0], loss, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(got[1], grad, rtol=1e-12, atol=1e-15)
    assert got[2] == pytest.approx(metrics, rel=1e-12, abs=1e-15)


SHARES = ("opsm_masked_frac", "kl", "pg_loss", "kl_loss", "log_ratio_sampling")  # summed over parts
TOKEN_MEANS = ("clip_frac", "ratio_mean")  # weighted by each part's tokens


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    delta=st.floats(-1.0, 1.0),
    parts=st.lists(st.integers(0, 2), min_size=B, max_size=B),
)
def test_parts_with_the_whole_batchs_totals_add_up_to_the_whole_batch(seed, delta, parts):
    """Rows split into parts (micro-batches) however outputs straddle them: given the whole batch's
    :class:`OutputTotals` and, for Eq. 9, the log-ratio of each output outside the part, the parts'
    losses, gradients and share metrics sum to the whole batch's."""
    lp, old, A, mask, ref, samp, beta = output_batch(seed)
    kwargs = dict(sampling_logprobs=samp, ref_logprobs=ref, kl_coef=beta, opsm_delta=delta)
    whole, whole_grad = grad_of(lambda x: grpo_loss(x, old, A, mask, **kwargs, sequence_ids=IDS)[0], lp)
    _, whole_metrics = grpo_loss(lp, old, A, mask, **kwargs, sequence_ids=IDS)

    totals = OutputTotals.of(mask, IDS)
    row_log_ratio = torch.where(mask, samp - lp, 0.0).sum(-1)  # Σ log(π_sampling/π_θ) per row
    x = lp.clone().requires_grad_()
    loss, sums, n_tokens = 0.0, dict.fromkeys(SHARES + TOKEN_MEANS, 0.0), int(mask.sum())
    for p in set(parts):
        rows = torch.tensor([i for i in range(B) if parts[i] == p])
        outside = torch.tensor([i for i in range(B) if parts[i] != p], dtype=torch.long)
        rest = torch.zeros(3, dtype=F64).index_add_(0, IDS[outside], row_log_ratio[outside])[IDS[rows]]
        part_kwargs = {k: v[rows] for k, v in kwargs.items() if torch.is_tensor(v)} | {"opsm_delta": delta}
        part_loss, m = grpo_loss(
            x[rows], old[rows], A[rows], mask[rows], **part_kwargs, sequence_ids=IDS[rows],
            totals=totals.part(rows, rest),
        )  # fmt: skip
        loss = loss + part_loss
        for k in SHARES:
            sums[k] += m[k]
        for k in TOKEN_MEANS:
            sums[k] += m[k] * m["tokens"] / n_tokens
    loss.backward()
    torch.testing.assert_close(loss.detach(), whole, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(x.grad, whole_grad, rtol=1e-10, atol=1e-14)
    assert sums == pytest.approx({k: whole_metrics[k] for k in sums}, rel=1e-10, abs=1e-14)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(sequence_ids=torch.zeros(B + 1, dtype=torch.long)), r"sequence_ids must have shape \[5\]"),
        (dict(sequence_ids=torch.zeros(B)), r"sequence_ids must be integers"),
        (dict(sequence_ids=torch.tensor([0, 0, 1, 2, 3])), r"must share their advantage and kl_coef"),
        (
            dict(sequence_ids=torch.tensor([0, 0, 1, 1, 2]), advantages=torch.ones(B)),
            r"must share their advantage and kl_coef",
        ),
        (
            dict(totals=OutputTotals(torch.ones(B, dtype=torch.long), 5, torch.zeros(B))),
            r"totals.tokens counts fewer tokens",
        ),
        (dict(totals=OutputTotals(torch.ones(B + 1), 5, torch.zeros(B))), r"totals.tokens must have shape"),
    ],
)
def test_bad_sequence_ids_and_totals_are_rejected(kwargs, match):
    args = dict(
        advantages=torch.arange(B, dtype=torch.float32), kl_coef=torch.tensor([0.1, 0.2, 0.2, 0.3, 0.3])
    )
    args |= kwargs
    with pytest.raises(ValueError, match=match):
        grpo_loss(
            torch.zeros(B, T),
            torch.zeros(B, T),
            args.pop("advantages"),
            torch.ones(B, T),
            ref_logprobs=torch.zeros(B, T),
            **args,
        )


# ---------------------------------------------------------------- Keep Sampling Mask


def sampling_record(logits, params, no_record, seed=0):
    """What the engine records: tokens sampled from the truncated distribution, their log-probs, and
    the kept sets as -1-padded ids (positions in ``no_record`` have none and use the full softmax)."""
    Bk, Tk, V = logits.shape
    keep = kept_mask(logits.reshape(Bk * Tk, V), params).reshape(Bk, Tk, V)
    keep[no_record] = True
    logp = (logits / params.temperature).masked_fill(~keep, -math.inf).log_softmax(-1)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.multinomial(logp.exp().reshape(-1, V), 1, generator=g).view(Bk, Tk)
    keep[no_record] = False
    ids = torch.full((Bk, Tk, int(keep.sum(-1).max())), -1, dtype=torch.long)
    for b in range(Bk):
        for t in range(Tk):
            kept = keep[b, t].nonzero().squeeze(-1)
            ids[b, t, : len(kept)] = kept[torch.randperm(len(kept), generator=g)]  # order is irrelevant
    return tokens, logp.gather(-1, tokens[..., None]).squeeze(-1), ids


def ksm_batch(dtype=F64):
    g = torch.Generator().manual_seed(7)
    logits = 2.5 * torch.randn(3, 6, 40, generator=g, dtype=dtype)
    no_record = torch.zeros(3, 6, dtype=torch.bool)
    no_record[:, :2] = True  # the prompt
    no_record[2, 4:] = True  # padding after an early end
    return logits, no_record


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_keep_sampling_mask_makes_an_unchanged_policy_ratio_exactly_one(temperature):
    logits, no_record = ksm_batch()
    params = SamplingParams(temperature=temperature, top_p=0.9)
    tokens, sampling_logp, ids = sampling_record(logits, params, no_record)

    masked = token_logprobs(logits, tokens, ids, temperature)
    torch.testing.assert_close(masked, sampling_logp, rtol=0, atol=1e-12)
    torch.testing.assert_close((masked - sampling_logp).exp(), torch.ones_like(masked), rtol=0, atol=1e-12)

    full = token_logprobs(logits, tokens, None, temperature)
    mass = kept_log_mass(logits, ids, temperature)
    torch.testing.assert_close(full - sampling_logp, mass, rtol=0, atol=1e-12)
    assert torch.equal(mass[no_record], torch.zeros(int(no_record.sum()), dtype=F64))
    assert float(mass[~no_record].min()) < -0.01  # top-p really truncated something

    mask = ~no_record
    _, m = grpo_loss(masked, sampling_logp, torch.ones(3, dtype=F64), mask, sampling_logprobs=sampling_logp)
    assert m["ratio_min"] == pytest.approx(1.0, abs=1e-12) and m["ratio_max"] == pytest.approx(1.0, abs=1e-12)


def test_token_logprobs_gradient_matches_the_engine_formula():
    logits, no_record = ksm_batch()
    params = SamplingParams(temperature=0.8, top_p=0.9)
    tokens, _, ids = sampling_record(logits, params, no_record)
    V = logits.shape[-1]
    slots = torch.zeros(*logits.shape[:2], V + 1, dtype=torch.bool)  # slot V absorbs the -1 padding
    keep = slots.scatter(-1, torch.where(ids < 0, V, ids), True)[..., :V] | no_record[..., None]

    def engine(x):
        return (x / 0.8).masked_fill(~keep, -math.inf).log_softmax(-1).gather(-1, tokens[..., None]).sum()

    _, grad = grad_of(lambda x: token_logprobs(x, tokens, ids, 0.8).sum(), logits)
    _, want = grad_of(engine, logits)
    torch.testing.assert_close(grad, want, rtol=1e-10, atol=1e-12)
    assert torch.equal(grad[~keep], torch.zeros(int((~keep).sum()), dtype=F64))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_logprobs_keeps_at_most_one_extra_vocab_sized_tensor(dtype, temperature):
    logits, no_record = ksm_batch(torch.float32)
    tokens, _, ids = sampling_record(
        logits.double(), SamplingParams(temperature=temperature, top_p=0.9), no_record
    )
    logits = logits.to(dtype).requires_grad_()
    vocab_sized = set()

    def pack(t):
        if t.numel() == logits.numel() and t.data_ptr() != logits.data_ptr():
            vocab_sized.add(t.data_ptr())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = token_logprobs(logits, tokens, ids, temperature)
    assert len(vocab_sized) <= 1
    want = token_logprobs(logits.detach().float(), tokens, ids, temperature)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-6)
    out.sum().backward()
    assert logits.grad is not None and torch.isfinite(logits.grad.float()).all()


def test_token_outside_its_kept_set_is_rejected():
    logits, no_record = ksm_batch()
    tokens, _, ids = sampling_record(logits, SamplingParams(top_p=0.5), no_record)
    outside = next(v for v in range(40) if v not in ids[1, 3].tolist())
    tokens[1, 3] = outside
    with pytest.raises(ValueError, match=r"at \[1, 3\] is not in its kept set"):
        token_logprobs(logits, tokens, ids)
    tokens[0, 0] = outside  # a position with no record accepts any token
    with pytest.raises(ValueError, match="kept_ids must have shape"):
        token_logprobs(logits, tokens, ids[:, :-1])
    with pytest.raises(ValueError, match="twice"):
        token_logprobs(logits, tokens, torch.cat([ids, ids[..., :1]], -1))
    for bad in (0.0, math.nan):
        with pytest.raises(ValueError, match="temperature must be > 0"):
            token_logprobs(logits, tokens, ids, temperature=bad)
    V = logits.shape[-1]
    with pytest.raises(ValueError, match=f"token id {V} is outside the logits' vocabulary of {V}"):
        token_logprobs(logits, tokens.clone().fill_(V))
