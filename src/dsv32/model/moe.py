"""DeepSeekMoE: a router with auxiliary-loss-free balancing and group-limited top-k, routed experts,
and a shared expert — plus the *Keep Routing* hook used by RL (paper §3.1).

Routing (sigmoid scoring, the released model):

1. ``s = sigmoid(x · W_gate)`` per expert (fp32);
2. selection uses ``s + e_score_correction_bias`` (the bias only *selects*, it never weights);
3. experts are split into ``n_group`` groups scored by the sum of their two best biased scores; only
   experts in the ``topk_group`` best groups compete for the ``num_experts_per_tok`` slots;
4. the selected experts' *unbiased* scores are normalized to sum to 1 and scaled by
   ``routed_scaling_factor``.

With softmax scoring and no bias (V2-style) a group scores by its best expert, as in DeepSeek's
reference code. Keep Routing: pass ``forced_indices`` to skip steps 2–3 and reuse the experts chosen
at sampling time; the weights (step 4) still come from the live router, so it keeps its gradient.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dsv32.model.config import ModelConfig
from dsv32.model.layers import MLP


class Router(nn.Module):
    """Expert selection and weights. ``weight`` ``[E, hidden]``; ``e_score_correction_bias`` ``[E]``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.weight = nn.Parameter(torch.empty(config.n_routed_experts, config.hidden_size))
        if config.topk_method == "noaux_tc":
            self.register_buffer("e_score_correction_bias", torch.zeros(config.n_routed_experts))
        else:
            self.e_score_correction_bias = None

    def forward(
        self, x: torch.Tensor, forced_indices: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` ``[N, hidden]`` → ``(weights [N, k] fp32, indices [N, k] int64)``."""
        cfg = self.config
        logits = F.linear(x.float(), self.weight.float())
        scores = logits.sigmoid() if cfg.scoring_func == "sigmoid" else logits.softmax(dim=-1)
        if forced_indices is None:
            indices = self._select(scores.detach())
        else:
            indices = forced_indices.reshape(-1, cfg.num_experts_per_tok).to(x.device, torch.long)
        weights = scores.gather(1, indices)
        if cfg.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * cfg.routed_scaling_factor, indices

    def _select(self, scores: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        biased = (
            scores if self.e_score_correction_bias is None else scores + self.e_score_correction_bias.float()
        )
        if cfg.n_group > 1:
            grouped = biased.view(-1, cfg.n_group, cfg.n_routed_experts // cfg.n_group)
            if self.e_score_correction_bias is None:
                group_scores = grouped.amax(dim=-1)
            else:
                group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1)[0].sum(dim=-1)
            keep = group_scores.topk(cfg.topk_group, dim=-1, sorted=False)[1]
            group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep, True)
            biased = grouped.masked_fill(~group_mask.unsqueeze(-1), float("-inf")).flatten(1)
        return biased.topk(cfg.num_experts_per_tok, dim=-1, sorted=False)[1]


class RoutedExperts(nn.Module):
    """The routed experts' SwiGLU weights stacked along a leading expert axis.

    ``gate_proj``/``up_proj`` ``[E, moe_inter, hidden]``, ``down_proj`` ``[E, hidden, moe_inter]``.
    In a checkpoint each expert is stored separately as ``experts.{e}.gate_proj.weight`` etc.;
    :mod:`dsv32.model.checkpoint` maps between the two. (Stacking keeps construction of the 14,848
    experts of the full model instant and lets expert-parallel code shard one tensor.)
    """

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.gate_proj = nn.Parameter(torch.empty(num_experts, intermediate_size, hidden_size))
        self.up_proj = nn.Parameter(torch.empty(num_experts, intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))

    def expert_forward(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert ``e`` on tokens ``x`` ``[N, hidden]``."""
        return F.linear(
            F.silu(F.linear(x, self.gate_proj[e])) * F.linear(x, self.up_proj[e]), self.down_proj[e]
        )

    def forward(self, x: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """``x`` ``[N, hidden]``, ``weights``/``indices`` ``[N, k]`` → weighted sum of expert outputs."""
        k = indices.shape[-1]
        out = torch.zeros_like(x)
        # Sort the (token, slot) pairs by expert so each expert runs once on all of its tokens.
        order = indices.flatten().argsort(stable=True)
        counts = torch.bincount(indices.flatten(), minlength=self.num_experts).tolist()
        flat_weights = weights.flatten()
        start = 0
        for e, count in enumerate(counts):
            if count:
                pairs = order[start : start + count]
                tokens = pairs // k
                y = self.expert_forward(e, x[tokens]) * flat_weights[pairs, None]
                out.index_add_(0, tokens, y.to(out.dtype))
                start += count
        return out


class MoE(nn.Module):
    """Router (``gate``), routed experts (``experts``) and shared expert(s) (``shared_experts``)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.gate = Router(config)
        self.experts = RoutedExperts(
            config.n_routed_experts, config.hidden_size, config.moe_intermediate_size
        )
        self.shared_experts = (
            MLP(config.hidden_size, config.moe_intermediate_size * config.n_shared_experts)
            if config.n_shared_experts
            else None
        )

    def forward(
        self, x: torch.Tensor, forced_indices: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` ``[B, T, hidden]`` → ``(y [B, T, hidden], expert indices [B, T, k])``."""
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        weights, indices = self.gate(flat, forced_indices)
        out = self.experts(flat, weights, indices)
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)
        return out.view(shape), indices.view(*shape[:-1], indices.shape[-1])
