"""DeepSeekMoE routing rules and the Keep Routing hook."""

from __future__ import annotations

import torch
from helpers.model import tiny_config

from dsv32.model import DeepseekV32
from dsv32.model.moe import Router


def _cfg(**kw):
    """The tiny config with 8 experts in 4 groups, 2 groups and 3 experts a token."""
    return tiny_config(
        **{"n_routed_experts": 8, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 3, **kw}
    )


def _direct_routing(x, weight, bias, cfg):
    """The routing rules written out token by token."""
    out_w, out_i = [], []
    for token in x:
        s = torch.sigmoid(weight @ token)
        b = s + bias
        per = cfg.n_routed_experts // cfg.n_group
        group_score = [sorted(b[g * per : (g + 1) * per].tolist())[-2:] for g in range(cfg.n_group)]
        groups = sorted(range(cfg.n_group), key=lambda g: -sum(group_score[g]))[: cfg.topk_group]
        allowed = [e for e in range(cfg.n_routed_experts) if e // per in groups]
        chosen = sorted(allowed, key=lambda e: -b[e].item())[: cfg.num_experts_per_tok]
        w = s[chosen] / s[chosen].sum() * cfg.routed_scaling_factor
        out_w.append(dict(zip(chosen, w.tolist())))
        out_i.append(set(chosen))
    return out_w, out_i


def test_router_follows_the_noaux_group_limited_rule():
    cfg = _cfg()
    torch.manual_seed(0)
    router = Router(cfg)
    router.weight.data.normal_()
    router.e_score_correction_bias.normal_(0, 0.5)
    x = torch.randn(20, cfg.hidden_size)
    weights, indices = router(x)
    exp_w, exp_i = _direct_routing(x, router.weight.data, router.e_score_correction_bias, cfg)
    for t in range(20):
        assert set(indices[t].tolist()) == exp_i[t]
        for slot, e in enumerate(indices[t].tolist()):
            assert abs(weights[t, slot].item() - exp_w[t][e]) < 1e-5


def test_bias_selects_but_never_weights():
    cfg = _cfg(n_group=1, topk_group=1)
    router = Router(cfg)
    router.weight.data.normal_()
    x = torch.randn(5, cfg.hidden_size)
    router.e_score_correction_bias.zero_()
    router.e_score_correction_bias[7] = 100.0  # expert 7 always selected...
    w, i = router(x)
    assert (i == 7).any(-1).all()
    scores = torch.sigmoid(x @ router.weight.data.T)
    chosen = scores.gather(1, i)
    # ...but weighted by its unbiased score, normalized over the selection
    assert torch.allclose(w, chosen / chosen.sum(-1, keepdim=True) * cfg.routed_scaling_factor, atol=1e-6)


def test_softmax_scoring_without_bias_uses_group_max():
    cfg = _cfg(scoring_func="softmax", topk_method="group_limited_greedy", norm_topk_prob=False)
    router = Router(cfg)
    assert router.e_score_correction_bias is None
    router.weight.data.normal_()
    x = torch.randn(6, cfg.hidden_size)
    w, i = router(x)
    s = (x @ router.weight.data.T).softmax(-1)
    best_groups = s.view(6, 4, 2).amax(-1).topk(2, -1).indices
    assert all(set((i[t] // 2).tolist()) <= set(best_groups[t].tolist()) for t in range(6))
    assert torch.allclose(w, s.gather(1, i) * cfg.routed_scaling_factor)


def test_keep_routing_forces_experts_and_keeps_router_gradients():
    torch.manual_seed(0)
    model = DeepseekV32(_cfg())
    ids = torch.randint(0, 64, (2, 6))
    live = model(ids, return_routing=True)
    assert live.routing.shape == (1, 2, 6, 3)
    other = (live.routing + 1) % 8  # a different, valid selection
    forced = model(ids, routing=other, return_routing=True)
    assert torch.equal(forced.routing, other)
    assert (forced.logits - live.logits).abs().max() > 1e-4
    forced.logits.square().mean().backward()
    gate = model.model.layers[1].mlp.gate.weight
    assert gate.grad is not None and gate.grad.abs().sum() > 0
