"""The GRPO objective as DeepSeek-V3.2 uses it (paper §3.1), as pure functions.

    J(θ) = 1/G Σ_i 1/|o_i| Σ_t [ min(r A, clip(r, 1-ε, 1+ε) A) · M_i  -  β_i · KL_i,t ]    (Eq. 5, 8)

    r_i,t   = π_θ(o_i,t) / π_old(o_i,t)                                                     (Eq. 6)
    KL_i,t  = r_i,t · ( π_ref/π_θ - log(π_ref/π_θ) - 1 )       unbiased K3 estimate          (Eq. 7)
    M_i     = 0  iff  A_i < 0  and  1/|o_i| Σ_t log(π_sampling/π_θ) > δ,  else 1              (Eq. 9)

- :func:`grpo_loss` returns ``-J`` and metrics; :func:`group_advantages` gives ``A_i = R_i - mean(R)``;
  :func:`sequence_kl_coefs` turns per-domain KL strengths into a per-sequence β.
- Keep Sampling Mask, training side: :func:`token_logprobs` renormalizes π_θ over the token set that
  top-k/top-p kept when sampling, so π_θ and π_old share one action space; :func:`kept_log_mass` is the
  log-probability mass of that set (what the log-ratio would be off by without the mask).

All per-token tensors are ``[B, T]`` (B rows, T positions), aligned so that position t holds the
log-probability of token o_t; ``mask`` marks the completion tokens. A row is one output o_i, or a piece
of one: ``sequence_ids`` groups the rows of an output laid out in several (an agentic episode), and
:class:`OutputTotals` lets a micro-batch that holds only some of an output's rows compute its exact
share of the batch's loss.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

KL_ESTIMATORS = ("unbiased", "k3")


def _check_shape(name: str, x: torch.Tensor | None, shape: tuple[int, ...], what: str) -> None:
    if x is not None and tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)} ({what}), got {list(x.shape)}")


@dataclass(frozen=True)
class OutputTotals:
    """What the whole batch says about each row's output o_i, for rows given to :func:`grpo_loss` as
    one part of a larger batch (a micro-batch) when an output's rows may lie in several parts.

    - ``tokens`` ``[B]``: |o_i|, the masked tokens of the row's output over all of its rows;
    - ``outputs``: the number of outputs with at least one masked token in the whole batch (the
      count Eq. 8 averages over);
    - ``log_ratio_rest`` ``[B]``: Σ log(π_sampling/π_θ) over the tokens of the row's output that lie
      outside this part (0 where every row of o_i is in the part); read only by Eq. 9.

    :meth:`of` gives the totals of a whole batch (every rest 0), :meth:`part` those of some of its rows.
    """

    tokens: torch.Tensor
    outputs: int
    log_ratio_rest: torch.Tensor

    @classmethod
    def of(cls, mask: torch.Tensor, sequence_ids: torch.Tensor | None = None) -> OutputTotals:
        """The totals of a whole ``[B, T]`` batch whose rows belong to outputs ``sequence_ids``."""
        index, n = output_index(sequence_ids, mask.shape[0], mask.device)
        row_tokens = (mask != 0).sum(-1)
        tokens = torch.zeros(n, dtype=row_tokens.dtype, device=mask.device).index_add_(0, index, row_tokens)
        rest = torch.zeros(mask.shape[0], device=mask.device)
        return cls(tokens[index], int((tokens > 0).sum()), rest)

    def part(self, rows: torch.Tensor, log_ratio_rest: torch.Tensor | None = None) -> OutputTotals:
        """The totals of ``rows`` (indices into the batch), with their ``log_ratio_rest`` if given."""
        rest = self.log_ratio_rest[rows] if log_ratio_rest is None else log_ratio_rest
        return OutputTotals(self.tokens[rows], self.outputs, rest)


def output_index(sequence_ids: torch.Tensor | None, B: int, device=None) -> tuple[torch.Tensor, int]:
    """``[B]`` index of each row's output in ``[0, n)``, and n. None: row i is output i."""
    if sequence_ids is None:
        return torch.arange(B, device=device), B
    _, index = torch.unique(sequence_ids, return_inverse=True)
    return index.to(device), int(index.max()) + 1 if B else 0


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logprobs: torch.Tensor | None = None,
    sampling_logprobs: torch.Tensor | None = None,
    clip_eps: float = 0.2,
    kl_coef: float | torch.Tensor = 0.0,
    kl_estimator: str = "unbiased",
    opsm_delta: float | None = None,
    sequence_ids: torch.Tensor | None = None,
    totals: OutputTotals | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``-J(θ)`` of Eq. 8 for a batch of outputs, and metrics (Python floats).

    Args:
        logprobs: ``[B, T]`` log π_θ(o_t), differentiable.
        old_logprobs: ``[B, T]`` log π_old(o_t), the policy the ratio r is taken against (Eq. 6).
        advantages: ``[B]`` A_i, the advantage of each row's output (see :func:`group_advantages`).
        mask: ``[B, T]`` bool or float, nonzero on completion tokens. Values elsewhere are ignored,
            even inf/NaN.
        ref_logprobs: ``[B, T]`` log π_ref(o_t); required when ``kl_coef`` is nonzero.
        sampling_logprobs: ``[B, T]`` log-probs returned by the inference engine; Eq. 9 measures the
            divergence against these (falls back to ``old_logprobs``).
        clip_eps: ε of the clipped ratio.
        kl_coef: β ≥ 0, a float or a ``[B]`` tensor (per output, e.g. per-domain strength).
        kl_estimator: ``"unbiased"`` (Eq. 7, the K3 estimate times the non-detached ratio r, whose
            gradient is unbiased for tokens sampled from π_old) or ``"k3"`` (Schulman's plain K3).
        opsm_delta: δ of Off-Policy Sequence Masking (Eq. 9); ``None`` turns it off.
        sequence_ids: ``[B]`` integers; rows with the same id are pieces of one output o_i (an
            agentic episode whose turns are laid out in several rows). ``None``: every row is an
            output of its own. Rows of one output must share their advantage and β.
        totals: the whole batch's :class:`OutputTotals` when these rows are one part of it (a
            micro-batch) and an output's rows may lie in other parts; ``None``: every output is
            whole here.

    An output o_i contributes the mean over all its masked tokens, across its rows (each token weighs
    1/|o_i|, Eq. 5), and outputs are averaged (Eq. 8's 1/G Σ_i); outputs with no masked token are left
    out of that average. Eq. 9's divergence 1/|o_i| Σ_t log(π_sampling/π_θ) is taken over the whole
    output, and M_i applies to all of its rows; M_i zeroes only the policy-gradient term, never the
    KL term. An empty batch gives a zero loss that is still connected to ``logprobs``.

    With ``totals``, |o_i|, the number of outputs and Eq. 9's divergence are the whole batch's, and the
    loss is this part's share of the whole batch's loss: the losses of the parts sum to it (and so do
    their gradients), however the rows are split.

    Metrics: ``clip_frac`` (share of tokens where the clipped branch won and differs), ``opsm_masked_frac``
    (share of outputs with M_i = 0), ``ratio_mean/max/min`` (r over masked tokens), ``kl`` (the
    estimate, averaged like the loss; reported whenever ``ref_logprobs`` is given, even at β = 0),
    ``pg_loss`` + ``kl_loss`` (= loss), ``log_ratio_sampling`` (mean over outputs of the Eq. 9
    divergence), ``tokens``. With ``totals``, the per-output ones (``opsm_masked_frac``, ``kl``,
    ``pg_loss``, ``kl_loss``, ``log_ratio_sampling``) are this part's share, which sum over the parts
    to the whole batch's; the per-token ones are over this part's tokens.
    """
    beta = _checked_inputs(
        logprobs, old_logprobs, advantages, mask, ref_logprobs, sampling_logprobs, clip_eps, kl_coef,
        kl_estimator, opsm_delta, sequence_ids, totals,
    )  # fmt: skip
    B, _ = logprobs.shape
    dtype, device = logprobs.dtype, logprobs.device
    use_kl = bool((beta != 0).any())

    # Outputs: row b is a piece of output index[b]; per-output values are sums of per-row ones.
    index, n_out = output_index(sequence_ids, B, device)

    def per_output(per_row: torch.Tensor) -> torch.Tensor:  # [B] → [n_out], summed over each output's rows
        return torch.zeros(n_out, dtype=per_row.dtype, device=device).index_add_(0, index, per_row)

    def of_output(per_row: torch.Tensor) -> torch.Tensor:  # [B] → [n_out], a value its rows share
        return torch.zeros(n_out, dtype=per_row.dtype, device=device).scatter_(0, index, per_row)

    A_out, beta_out = of_output(advantages), of_output(beta)
    if sequence_ids is not None and not (
        torch.equal(A_out[index], advantages) and torch.equal(beta_out[index], beta)
    ):
        raise ValueError("rows of one output (same sequence_ids) must share their advantage and kl_coef")

    mask = mask != 0
    mask_f = mask.to(dtype)
    local_lengths = per_output(mask_f.sum(-1))  # this call's tokens of each output, [n_out]
    if totals is None:
        lengths = local_lengths  # |o_i|
        has_tokens = lengths > 0
        n_seqs = has_tokens.sum().clamp_min(1)
    else:
        lengths = of_output(totals.tokens.to(dtype))
        if not bool((local_lengths <= lengths).all()):
            raise ValueError("totals.tokens counts fewer tokens of an output than these rows hold")
        has_tokens = lengths > 0
        n_seqs = torch.tensor(max(totals.outputs, 1), dtype=dtype, device=device)
    A = advantages.to(dtype)[:, None]  # [B, 1]

    def output_mean(x: torch.Tensor) -> torch.Tensor:
        """``[B, T]`` → ``[n_out]``: Σ of x over each output's masked tokens here, / |o_i| (0 if empty)."""
        return per_output((x * mask_f).sum(-1)) / lengths.clamp_min(1)

    # Eq. 6: the ratio, with padding positions set to log r = 0 so garbage there can never leak a NaN.
    log_r = torch.where(mask, logprobs - old_logprobs, 0.0)
    r = log_r.exp()
    pg_unclipped = r * A
    pg_clipped = r.clamp(1 - clip_eps, 1 + clip_eps) * A
    pg = torch.minimum(pg_unclipped, pg_clipped)  # [B, T]

    # Eq. 9: Off-Policy Sequence Masking, decided per output over all its tokens with π_θ detached.
    log_pi_sampling = sampling_logprobs if sampling_logprobs is not None else old_logprobs
    log_ratio_sampling = output_mean(torch.where(mask, log_pi_sampling - logprobs.detach(), 0.0))  # [n_out]
    divergence = log_ratio_sampling
    if totals is not None:
        divergence = log_ratio_sampling + of_output(totals.log_ratio_rest.to(dtype)) / lengths.clamp_min(1)
    if opsm_delta is None:
        opsm_masked = torch.zeros(n_out, dtype=torch.bool, device=device)
    else:
        opsm_masked = (A_out < 0) & (divergence > opsm_delta) & has_tokens
    M = (~opsm_masked).to(dtype)[index][:, None]  # [B, 1]

    # Eq. 7: K3 = π_ref/π_θ - log(π_ref/π_θ) - 1 = expm1(x) - x with x = log π_ref - log π_θ.
    if ref_logprobs is not None:
        x = torch.where(mask, ref_logprobs - logprobs, 0.0)
        kl = torch.expm1(x) - x
        if kl_estimator == "unbiased":
            kl = r * kl  # r not detached: its gradient is what makes the estimate unbiased
    else:
        kl = torch.zeros_like(logprobs)

    pg_seq = output_mean(pg * M)  # [n_out]
    kl_seq = output_mean(kl)  # [n_out]
    J_seq = pg_seq - beta_out * kl_seq if use_kl else pg_seq
    loss = -(J_seq * has_tokens).sum() / n_seqs

    metrics = _loss_metrics(
        mask, r, pg_clipped < pg_unclipped, has_tokens, n_seqs, local_lengths, lengths, opsm_masked,
        pg_seq, kl_seq, beta_out if use_kl else None, log_ratio_sampling,
    )  # fmt: skip
    return loss, metrics


@torch.no_grad()
def _loss_metrics(
    mask, r, clipped, has_tokens, n_seqs, local_lengths, lengths, opsm_masked, pg_seq, kl_seq, beta_out,
    log_ratio_sampling,
) -> dict[str, float]:  # fmt: skip
    """:func:`grpo_loss`'s metrics (Python floats) from its per-token ``[B, T]`` and per-output
    ``[n_out]`` terms; ``beta_out`` None: no KL term."""
    n_tokens = int(mask.sum())

    def batch_mean(per_seq: torch.Tensor) -> float:
        return float((per_seq * has_tokens).sum() / n_seqs)

    r_tokens = r[mask]
    # each masked output counts by the share of its tokens that is here (all of it without totals)
    here = torch.where(has_tokens, local_lengths / lengths.clamp_min(1), 0.0)
    return {
        "clip_frac": float((mask & clipped).sum()) / max(n_tokens, 1),
        "opsm_masked_frac": float((opsm_masked * here).sum()) / int(n_seqs),
        "ratio_mean": float(r_tokens.mean()) if n_tokens else 1.0,
        "ratio_max": float(r_tokens.max()) if n_tokens else 1.0,
        "ratio_min": float(r_tokens.min()) if n_tokens else 1.0,
        "kl": batch_mean(kl_seq),
        "pg_loss": -batch_mean(pg_seq),
        "kl_loss": batch_mean(beta_out * kl_seq) if beta_out is not None else 0.0,
        "log_ratio_sampling": batch_mean(log_ratio_sampling),
        "tokens": float(n_tokens),
    }


def _checked_inputs(
    logprobs, old_logprobs, advantages, mask, ref_logprobs, sampling_logprobs, clip_eps, kl_coef,
    kl_estimator, opsm_delta, sequence_ids, totals,
) -> torch.Tensor:  # fmt: skip
    """:func:`grpo_loss`'s arguments checked (a ``ValueError`` that names the bad one); returns β as
    a ``[B]`` tensor."""
    if logprobs.dim() != 2 or not logprobs.is_floating_point():
        raise ValueError(f"logprobs must be a floating [B, T] tensor, got {list(logprobs.shape)}")
    B, T = logprobs.shape
    per_token = {"old_logprobs": old_logprobs, "mask": mask, "ref_logprobs": ref_logprobs}
    for name, x in {**per_token, "sampling_logprobs": sampling_logprobs}.items():
        _check_shape(name, x, (B, T), "[B, T] like logprobs")
    _check_shape("advantages", advantages, (B,), "[B], one per row")
    _check_shape("sequence_ids", sequence_ids, (B,), "[B], one per row")
    if sequence_ids is not None and sequence_ids.is_floating_point():
        raise ValueError(f"sequence_ids must be integers, got {sequence_ids.dtype}")
    if totals is not None:
        _check_shape("totals.tokens", totals.tokens, (B,), "[B], one per row")
        _check_shape("totals.log_ratio_rest", totals.log_ratio_rest, (B,), "[B], one per row")
    if kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {kl_estimator!r}")
    if not clip_eps >= 0:  # NaN included
        raise ValueError(f"clip_eps must be a number >= 0, got {clip_eps}")
    if opsm_delta is not None and opsm_delta != opsm_delta:  # NaN would silently turn the mask off
        raise ValueError("opsm_delta is NaN; give a number, or None to turn the mask off")
    beta = torch.as_tensor(kl_coef, dtype=logprobs.dtype, device=logprobs.device)
    if beta.dim() == 0:
        beta = beta.expand(B)
    _check_shape("kl_coef", beta, (B,), "a float or [B], one per row")
    if not bool((beta >= 0).all()):  # NaN included
        raise ValueError("kl_coef must be >= 0 and not NaN (it is a penalty strength β)")
    if bool((beta != 0).any()) and ref_logprobs is None:
        raise ValueError("kl_coef is nonzero but ref_logprobs was not given: pass log π_ref or set kl_coef=0")
    if not bool(torch.isfinite(advantages).all()):
        raise ValueError("advantages contain inf or NaN")
    return beta


def group_advantages(
    rewards: torch.Tensor | Sequence[float],
    group_size: int,
    scale: str = "none",
    valid: torch.Tensor | Sequence[bool] | None = None,
) -> torch.Tensor:
    """``[N]`` rewards of consecutive groups of ``group_size`` → ``[N]`` advantages A_i = R_i - mean(R).

    ``scale="none"`` is the paper's form (§3.1); ``scale="std"`` also divides by the group's
    (population) standard deviation + 1e-6, as the original GRPO does. A group of equal rewards gets
    exactly zero advantages. ``valid`` (``[N]`` bools): members without a reward (their environment
    failed) get zero advantage and are left out of their group's mean and standard deviation.
    """
    rewards = torch.as_tensor(rewards)  # a list of floats works too
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be a [N] tensor, got shape {list(rewards.shape)}")
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise ValueError(f"group_size must be an integer, got {group_size!r}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards has {rewards.numel()} entries, not a multiple of group_size={group_size}")
    if scale not in ("none", "std"):
        raise ValueError(f"scale must be 'none' or 'std', got {scale!r}")
    R = rewards.float() if not rewards.is_floating_point() else rewards
    R = R.reshape(-1, group_size)  # [groups, G]
    if valid is None:
        A = R - R.mean(-1, keepdim=True)
        if scale == "std":
            A = A / (R.std(-1, correction=0, keepdim=True) + 1e-6)
        equal = R.amax(-1, keepdim=True) == R.amin(-1, keepdim=True)
        return torch.where(equal, torch.zeros_like(A), A).view(-1)
    V = torch.as_tensor(valid, dtype=torch.bool, device=R.device)
    if V.shape != (rewards.numel(),):
        raise ValueError(f"valid must be [N] = [{rewards.numel()}] bools, got shape {list(V.shape)}")
    V = V.reshape(-1, group_size)
    n = V.sum(-1, keepdim=True).clamp(min=1)
    mean = torch.where(V, R, 0).sum(-1, keepdim=True) / n
    A = R - mean
    if scale == "std":
        A = A / ((torch.where(V, A, 0) ** 2).sum(-1, keepdim=True) / n).sqrt().add(1e-6)
    big, small = (
        torch.where(V, R, -torch.inf).amax(-1, keepdim=True),
        torch.where(V, R, torch.inf).amin(-1, keepdim=True),
    )
    return torch.where(V & (big != small), A, torch.zeros_like(A)).view(-1)


def sequence_kl_coefs(domains: list[str], coefs: Mapping[str, float], default: float = 0.0) -> torch.Tensor:
    """``[B]`` β per sequence from its domain (the paper sets KL strength per domain; weak or none for
    math). Domains missing from ``coefs`` get ``default``."""
    betas = [float(coefs.get(d, default)) for d in domains]
    if not all(b >= 0 for b in betas):  # NaN included
        raise ValueError(f"KL coefficients must be >= 0, got {dict(coefs)} (default {default})")
    return torch.tensor(betas, dtype=torch.float32)


# ---------------------------------------------------------------- Keep Sampling Mask (training side)


def _scaled_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """z = logits / τ in at least float32: at most one new ``[B, T, V]`` tensor (none for fp32, τ=1)."""
    if not temperature > 0:  # NaN included
        raise ValueError(f"temperature must be > 0, got {temperature} (greedy rollouts have no kept set)")
    if logits.dtype in (torch.float32, torch.float64):
        return logits if temperature == 1.0 else logits / temperature
    z = logits.float()  # the one copy; dividing it in place is autograd-safe (the cast saves nothing)
    return z if temperature == 1.0 else z.div_(temperature)


def _kept_logsumexp(z: torch.Tensor, kept_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``z`` ``[B, T, V]``, ``kept_ids`` ``[B, T, K]`` → (logsumexp of z over the kept set ``[B, T]``,
    has_record ``[B, T]``); -inf where there is no record."""
    B, T, V = z.shape
    if kept_ids.dim() != 3 or tuple(kept_ids.shape[:2]) != (B, T):
        raise ValueError(
            f"kept_ids must have shape [{B}, {T}, K] (-1 padded ids), got {list(kept_ids.shape)}"
        )
    if kept_ids.is_floating_point():
        raise ValueError(f"kept_ids must be integer token ids, got {kept_ids.dtype}")
    if kept_ids.numel() and int(kept_ids.max()) >= V:
        raise ValueError(f"kept_ids holds id {int(kept_ids.max())}, outside the vocabulary of size {V}")
    kept = kept_ids >= 0
    ids = kept_ids.sort(-1).values
    if bool(((ids[..., 1:] == ids[..., :-1]) & (ids[..., 1:] >= 0)).any()):
        raise ValueError("kept_ids lists a token id twice at one position")
    has_record = kept.any(-1)
    z_kept = z.gather(-1, kept_ids.clamp_min(0).long()).masked_fill(~kept, float("-inf"))  # [B, T, K]
    return z_kept.logsumexp(-1), has_record


def token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, kept_ids: torch.Tensor | None = None, temperature: float = 1.0
) -> torch.Tensor:
    """log π_θ(o_t) ``[B, T]`` for ``tokens`` ``[B, T]`` under ``logits`` ``[B, T, V]`` (logits[b, t] is
    the distribution token[b, t] was drawn from), with Keep Sampling Mask:

        log π_θ(o_t) = z[o_t] - logsumexp_{v ∈ kept_t} z[v],     z = logits / τ

    ``kept_ids`` ``[B, T, K]``: the distinct ids top-k/top-p kept when sampling position t, padded
    with -1; a position with no record (all -1: prompt, padding) uses the full softmax, as does
    ``kept_ids=None``. A token outside its kept set is a ValueError. Differentiable w.r.t. ``logits``.
    """
    if logits.dim() != 3 or tuple(tokens.shape) != tuple(logits.shape[:2]):
        raise ValueError(
            f"logits must be [B, T, V] and tokens [B, T]; got {list(logits.shape)} and {list(tokens.shape)}"
        )
    outside = (tokens < 0) | (tokens >= logits.shape[-1])
    if bool(outside.any()):  # one sync; the id only when there is one to name
        bad = int(tokens[outside][0])
        raise ValueError(f"token id {bad} is outside the logits' vocabulary of {logits.shape[-1]}")
    z = _scaled_logits(logits, temperature)
    z_token = z.gather(-1, tokens.long()[..., None]).squeeze(-1)  # [B, T]
    if kept_ids is None:
        return z_token - z.logsumexp(-1)
    lse_kept, has_record = _kept_logsumexp(z, kept_ids)
    # the full softmax's normalizer only where there is no record (a pass over V per position)
    lse = lse_kept.masked_scatter(~has_record, z[~has_record].logsumexp(-1))
    in_kept = (kept_ids == tokens[..., None]).any(-1) | ~has_record
    if not bool(in_kept.all()):
        b, t = (~in_kept).nonzero()[0].tolist()
        raise ValueError(
            f"token {int(tokens[b, t])} at [{b}, {t}] is not in its kept set: kept_ids does not belong to "
            "these tokens (check the alignment of the sampling record)"
        )
    return z_token - lse


def kept_log_mass(logits: torch.Tensor, kept_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``[B, T]``: log Σ_{v ∈ kept_t} softmax(logits / τ)[v], the log of the untruncated mass of the
    kept set (0 where there is no record). Without Keep Sampling Mask the training-side log-ratio
    log π_θ - log π_sampling of an unchanged policy equals exactly this, instead of 0."""
    if logits.dim() != 3:
        raise ValueError(f"logits must be [B, T, V], got {list(logits.shape)}")
    z = _scaled_logits(logits, temperature)
    lse_kept, has_record = _kept_logsumexp(z, kept_ids)
    lse_full = z.logsumexp(-1)
    return torch.where(has_record, lse_kept - lse_full, 0.0)
