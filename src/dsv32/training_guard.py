"""Non-finite updates, shared by every trainer: a step whose loss or gradient norm is NaN/inf is
skipped (its gradients dropped, the weights and the optimizer's moments left as they were) and
counted; :class:`UpdateGuard` stops the run with :class:`NonFiniteUpdateError` after ``limit`` such
steps in a row, and :func:`check_finite_weights` refuses to let non-finite weights reach a checkpoint.

The trainers save the guard's streak with each checkpoint and restore it on resume, so a streak spans
an interruption."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv32.errors import DSV32Error


class NonFiniteUpdateError(DSV32Error, RuntimeError):
    """The loss or gradients stayed NaN/inf for too many optimizer steps in a row, or the weights are
    not finite: the run stops, and no checkpoint is written from such weights."""


@dataclass
class UpdateGuard:
    """Counts optimizer steps skipped in a row for a non-finite loss or gradient norm; the
    ``limit``-th raises :class:`NonFiniteUpdateError`, whose message ends with ``advice`` (what the
    user can change: the trainer's own recipe fields). One guard per run: a streak spans steps, and
    a resume (the training loop saves it with each checkpoint)."""

    limit: int
    streak: int = 0
    advice: str = "lower the learning rate, tighten gradient clipping, or check the model's dtype"

    def allows(self, finite: bool, grad_norm: float) -> bool:
        """Whether the optimizer step may be taken; a non-finite one extends the streak."""
        if finite:
            self.streak = 0
            return True
        self.streak += 1
        if self.streak >= self.limit:
            raise NonFiniteUpdateError(
                f"{self.streak} optimizer steps in a row had a non-finite loss or gradient norm (last "
                f"gradient norm {grad_norm}); all were skipped and the weights are unchanged: {self.advice}"
            )
        return False

    def restore(self, state: dict) -> None:
        """Take the streak saved in a checkpoint's ``state`` (``skipped_streak``; 0 when absent)."""
        streak = state.get("skipped_streak", 0)
        self.streak = streak if isinstance(streak, int) and streak >= 0 else 0


def check_finite_weights(
    model: torch.nn.Module,
    step: int,
    *,
    whose: str = "model's",
    advice: str = "resume from the last checkpoint with a lower learning rate or tighter gradient clipping",
) -> None:
    """Raise :class:`NonFiniteUpdateError` when a parameter of ``model`` holds NaN or inf (one device
    sync for all parameters; the names are looked up only then)."""
    # a sharded parameter (FSDP) is checked on this rank's shard
    params = [(n, p.to_local() if hasattr(p, "to_local") else p) for n, p in model.named_parameters()]
    if not params or bool(torch.stack([torch.isfinite(p).all() for _, p in params]).all()):
        return
    bad = [name for name, p in params if not bool(torch.isfinite(p).all())]
    raise NonFiniteUpdateError(
        f"after step {step} the {whose} weights hold NaN or inf ({', '.join(bad[:3])}"
        f"{', …' if len(bad) > 3 else ''}); no checkpoint or model is written from them: {advice}"
    )


__all__ = ["NonFiniteUpdateError", "UpdateGuard", "check_finite_weights"]
