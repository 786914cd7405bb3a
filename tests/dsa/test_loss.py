"""The indexer KL loss (paper Eq. 3/4) against a literal implementation, and attention recall."""

from __future__ import annotations

import math

import pytest
import torch

from dsv32.dsa import (
    attention_recall,
    index_scores,
    indexer_kl_loss,
    indexer_kl_loss_chunked,
    oracle_topk,
    select_topk,
)


def literal_loss(attn_probs, scores, topk=None, key_padding_mask=None):
    """Eq. 3 / 4 written out per query with Python loops: p = L1-normalized head sum over S_t, then
    KL(p || softmax(I[S_t])); mean over the queries whose S_t is non-empty."""
    B, H, T, S = attn_probs.shape
    total, n = 0.0, 0
    for b in range(B):
        for t in range(T):
            keys = [s for s in range(S) if s <= t + S - T]
            if key_padding_mask is not None:
                keys = [s for s in keys if bool(key_padding_mask[b, s])]
            if topk is not None:
                chosen = set(topk[b, t].tolist())
                keys = [s for s in keys if s in chosen]
            if not keys:
                continue
            idx = torch.tensor(keys)
            p = attn_probs[b, :, t, idx].sum(0)
            if float(p.sum()) == 0:
                continue
            p = p / p.sum()
            log_q = torch.log_softmax(scores[b, t, idx], dim=-1)
            kl = sum(
                float(p[i]) * (math.log(float(p[i])) - log_q[i]) if float(p[i]) > 0 else 0.0
                for i in range(len(keys))
            )
            total = total + kl
            n += 1
    return total / n


def dense_probs(q, k, scale, topk=None, key_padding_mask=None):
    """[B, H, T, S] softmax of q·k over the visible (and selected) keys; GQA keys repeated."""
    B, T, H, D = q.shape
    S = k.shape[1]
    kk = k.repeat_interleave(H // k.shape[2], dim=2)
    logits = torch.einsum("bthd,bshd->bhts", q, kk) * scale
    allowed = torch.ones(T, S, dtype=torch.bool).tril(S - T).expand(B, T, S)
    if key_padding_mask is not None:
        allowed = allowed & key_padding_mask.bool().unsqueeze(1)
    if topk is not None:
        sel = torch.zeros(B, T, S + 1, dtype=torch.bool).scatter_(-1, torch.where(topk < 0, S, topk), True)
        allowed = allowed & sel[..., :S]
    probs = torch.softmax(logits.masked_fill(~allowed.unsqueeze(1), float("-inf")), dim=-1)
    return torch.nan_to_num(probs, nan=0.0)


def make(B=2, T=9, S=12, H=4, Hkv=2, D=8, HI=3, DI=6, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, D, generator=g, dtype=dtype)
    k = torch.randn(B, S, Hkv, D, generator=g, dtype=dtype)
    iq = torch.randn(B, T, HI, DI, generator=g, dtype=dtype, requires_grad=True)
    iw = torch.randn(B, T, HI, generator=g, dtype=dtype, requires_grad=True)
    ik = torch.randn(B, S, DI, generator=g, dtype=dtype, requires_grad=True)
    return q, k, iq, iw, ik


@pytest.mark.parametrize("sparse", [False, True])
def test_indexer_kl_loss_matches_literal_equations_value_and_grad(sparse):
    q, k, iq, iw, ik = make()
    pad = torch.ones(2, 12, dtype=torch.bool)
    pad[1, :3] = False
    scores = index_scores(iq, iw, ik).double()
    topk = select_topk(scores.detach(), 4, key_padding_mask=pad) if sparse else None
    probs = dense_probs(q, k, 0.3, topk, pad)
    got = indexer_kl_loss(probs, scores, topk, key_padding_mask=pad)
    want = literal_loss(probs, scores, topk, pad)
    torch.testing.assert_close(got.double(), want.double(), rtol=1e-5, atol=1e-6)
    g_got = torch.autograd.grad(got, (iq, iw, ik), retain_graph=True)
    g_want = torch.autograd.grad(want, (iq, iw, ik))
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("chunk", [1, 4, None])
@pytest.mark.parametrize("padded", [False, True])
def test_chunked_loss_equals_direct_value_and_grads(sparse, chunk, padded):
    q, k, iq, iw, ik = make(seed=1)
    pad = None
    if padded:
        pad = torch.ones(2, 12, dtype=torch.bool)
        pad[0, :5] = False
    scale = 0.4
    scores = index_scores(iq, iw, ik)
    topk = select_topk(scores.detach(), 5, key_padding_mask=pad) if sparse else None
    direct = indexer_kl_loss(dense_probs(q, k, scale, topk, pad), scores, topk, key_padding_mask=pad)
    chunked = indexer_kl_loss_chunked(
        q, k, iq, iw, ik, scale=scale, topk_indices=topk, key_padding_mask=pad, chunk_size=chunk
    )
    torch.testing.assert_close(chunked.double(), direct.double(), rtol=1e-5, atol=1e-6)
    for a, b in zip(torch.autograd.grad(chunked, (iq, iw, ik)), torch.autograd.grad(direct, (iq, iw, ik))):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("sparse", [False, True])
def test_a_nan_in_the_attention_inputs_reaches_the_chunked_loss(sparse):
    """Padded queries see no key and are left out; a NaN query is not padding and must not vanish."""
    q, k, iq, iw, ik = make(seed=4)
    pad = torch.ones(2, 12, dtype=torch.bool)
    pad[0, :5] = False
    topk = select_topk(index_scores(iq, iw, ik).detach(), 5, key_padding_mask=pad) if sparse else None
    kw = dict(scale=0.4, topk_indices=topk, key_padding_mask=pad, chunk_size=4)
    assert torch.isfinite(indexer_kl_loss_chunked(q, k, iq, iw, ik, **kw))
    q = q.detach().clone()
    q[1, 2, 0, 0] = float("nan")
    assert torch.isnan(indexer_kl_loss_chunked(q, k, iq, iw, ik, **kw))


def test_chunked_loss_query_subset_and_grad_scaling():
    q, k, iq, iw, ik = make(T=12, S=12, seed=2)
    rows = torch.tensor([3, 7, 8, 11])
    sub = indexer_kl_loss_chunked(q, k, iq, iw, ik, scale=0.5, query_rows=rows, chunk_size=3)
    probs = dense_probs(q, k, 0.5)
    scores = index_scores(iq, iw, ik)
    per_row = []
    for b in range(2):
        for t in rows.tolist():
            p = probs[b, :, t, : t + 1].sum(0)
            p = p / p.sum()
            lq = torch.log_softmax(scores[b, t, : t + 1], -1)
            per_row.append((p * (p.log() - lq)).sum())
    want = torch.stack(per_row).mean()
    torch.testing.assert_close(sub.double(), want.double(), rtol=1e-5, atol=1e-6)
    (3.0 * sub).backward()
    g = iq.grad.clone()
    iq.grad = None
    (3.0 * want).backward()
    torch.testing.assert_close(g, iq.grad, rtol=1e-4, atol=1e-6)


def test_losses_never_send_gradient_to_the_attention_side():
    q, k, iq, iw, ik = make(seed=3)
    q.requires_grad_(True)
    k.requires_grad_(True)
    loss = indexer_kl_loss_chunked(q, k, iq, iw, ik, scale=0.3)
    loss.backward()
    assert q.grad is None and k.grad is None
    assert iq.grad is not None and ik.grad is not None and iw.grad is not None
    probs = dense_probs(q, k, 0.3)
    assert probs.requires_grad
    scores = index_scores(iq, iw, ik)
    indexer_kl_loss(probs, scores).backward()
    assert q.grad is None and k.grad is None


def test_loss_is_zero_when_the_indexer_matches_the_target_and_works_without_grad():
    T = 6
    probs = dense_probs(*make(B=1, T=T, S=T, seed=4)[:2], 0.5)
    target = probs.sum(1)
    scores = target.clamp_min(1e-30).log()  # softmax(log p) = p on the visible keys
    assert float(indexer_kl_loss(probs, scores)) == pytest.approx(0.0, abs=1e-6)
    q, k, iq, iw, ik = make(seed=5)
    with torch.no_grad():
        a = indexer_kl_loss_chunked(q, k, iq, iw, ik, scale=0.3)
    b = indexer_kl_loss_chunked(q, k, iq.detach(), iw.detach(), ik.detach(), scale=0.3)
    assert not a.requires_grad and float(a) == pytest.approx(float(b)) and float(a) > 0


def test_bad_shapes_raise():
    q, k, iq, iw, ik = make()
    with pytest.raises(ValueError, match="attn_probs"):
        indexer_kl_loss(torch.zeros(2, 3, 4), torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="multiple"):
        indexer_kl_loss_chunked(q, k[:, :, :1].expand(-1, -1, 3, -1), iq, iw, ik, scale=1.0)
    with pytest.raises(ValueError, match="projections"):
        indexer_kl_loss_chunked(q, k, iq[:, :3], iw, ik, scale=1.0)


def test_attention_recall_matches_direct_computation_and_oracle_bounds_it():
    q, k, iq, iw, ik = make(T=12, S=12, seed=6)
    scores = index_scores(iq, iw, ik).detach()
    sels = {"k3": select_topk(scores, 3), "k5": select_topk(scores, 5)}
    got = attention_recall(q, k, sels, scale=0.5, chunk_size=5)
    p = dense_probs(q, k, 0.5).mean(1)  # [B, T, S] head mean
    for name, K in (("k3", 3), ("k5", 5)):
        rec, orc, n = 0.0, 0.0, 0
        for b in range(2):
            for t in range(12):
                if t + 1 <= K:
                    continue
                idx = sels[name][b, t]
                rec += float(p[b, t, idx[idx >= 0]].sum())
                orc += float(p[b, t].topk(K).values.sum())
                n += 1
        assert got[name].queries == n
        assert got[name].mean_recall == pytest.approx(rec / n, rel=1e-6)
        assert got[name].mean_oracle == pytest.approx(orc / n, rel=1e-6)
        assert got[name].mean_recall <= got[name].mean_oracle + 1e-9
    # Selecting by the true head-summed attention reaches the oracle.
    oracle_sel = select_topk(p, 3)
    best = attention_recall(q, k, oracle_sel, scale=0.5)
    assert best.mean_recall == pytest.approx(best.mean_oracle, rel=1e-6)


@pytest.mark.parametrize("padded", [False, True])
def test_oracle_topk_is_the_head_summed_attention_top_k_and_reaches_the_oracle_recall(padded):
    q, k, *_ = make(T=9, S=12, seed=7)
    pad = None
    if padded:
        pad = torch.ones(2, 12, dtype=torch.bool)
        pad[1, :4] = False  # left padding of row 1
    for K in (3, 5, 20):
        got = oracle_topk(q, k, K, scale=0.5, key_padding_mask=pad, chunk_size=4)
        p = dense_probs(q, k, 0.5, key_padding_mask=pad).sum(1)  # [B, T, S] head sum
        assert got.shape == (2, 9, min(K, 12))
        for b in range(2):
            for t in range(9):
                visible = [s for s in range(12) if s <= t + 3 and (pad is None or bool(pad[b, s]))]
                chosen = [int(i) for i in got[b, t] if i >= 0]
                assert len(chosen) == min(K, len(visible)) and len(set(chosen)) == len(chosen)
                assert set(chosen) <= set(visible)
                best = sorted((float(p[b, t, s]) for s in visible), reverse=True)[: len(chosen)]
                assert sum(float(p[b, t, s]) for s in chosen) == pytest.approx(sum(best), rel=1e-9)
        rec = attention_recall(q, k, got, scale=0.5, key_padding_mask=pad)
        if rec.queries:
            assert rec.mean_recall == pytest.approx(rec.mean_oracle, rel=1e-9)


def test_attention_recall_refuses_a_selection_past_the_keys_or_of_another_shape():
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 6, 2, 8, generator=g), torch.randn(2, 6, 2, 8, generator=g)
    with pytest.raises(IndexError, match="selects key 99 but there are only 6 keys"):
        attention_recall(q, k, {"indexer": torch.full((2, 6, 4), 99)}, scale=0.3)
    with pytest.raises(ValueError, match="must be topk_indices"):
        attention_recall(q, k, torch.zeros(1, 6, 4, dtype=torch.long), scale=0.3)


@pytest.mark.parametrize("sparse", [False, True])
def test_chunked_loss_runs_in_fp32_inside_a_bf16_autocast_region(sparse):
    """Inside a model's bf16 autocast region the loss (and its backward) is the fp32 one, bit for bit."""
    q, k, iq, iw, ik = make(seed=5, dtype=torch.float32)
    topk = select_topk(index_scores(iq, iw, ik).detach(), 5) if sparse else None
    kw = dict(scale=0.4, topk_indices=topk, chunk_size=4)
    want = indexer_kl_loss_chunked(q, k, iq, iw, ik, **kw)
    g_want = torch.autograd.grad(want, (iq, iw, ik))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = indexer_kl_loss_chunked(q, k, iq, iw, ik, **kw)
        g_got = torch.autograd.grad(got, (iq, iw, ik))
    assert got.dtype == torch.float32 and torch.equal(got, want)
    for a, b in zip(g_got, g_want):
        assert a.dtype == torch.float32 and torch.equal(a, b)


@pytest.mark.parametrize("sparse", [False, True])
def test_chunk_sizes_do_not_change_the_chunked_loss_or_its_gradients(sparse):
    q, k, iq, iw, ik = make(B=2, T=12, S=15, seed=6)
    pad = torch.ones(2, 15, dtype=torch.bool)
    pad[1, :4] = False
    topk = select_topk(index_scores(iq, iw, ik).detach(), 5, key_padding_mask=pad) if sparse else None
    runs = []
    for rows in (None, torch.tensor([0, 2, 3, 7, 8, 11])):
        for chunk in (1, 2, 5, 12, None):
            loss = indexer_kl_loss_chunked(
                q, k, iq, iw, ik, scale=0.4, topk_indices=topk, key_padding_mask=pad, query_rows=rows,
                chunk_size=chunk,
            )  # fmt: skip
            runs.append((rows is None, loss, torch.autograd.grad(loss, (iq, iw, ik))))
    for whole, loss, grads in runs:
        ref = next(r for r in runs if r[0] == whole)
        torch.testing.assert_close(loss, ref[1], rtol=1e-5, atol=1e-7)  # fp32 inside: sums in another order
        for a, b in zip(grads, ref[2]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)  # fp32 inside: sums in another order


@pytest.mark.parametrize("rows", [None, [1, 4, 5, 9, 30, 31]])
def test_the_chunked_loss_reads_nothing_back_from_the_device_per_chunk(rows):
    from torch.profiler import ProfilerActivity, profile

    q, k, iq, iw, ik = make(B=1, T=32, S=32, seed=7, dtype=torch.float32)
    rows = None if rows is None else torch.tensor(rows)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loss = indexer_kl_loss_chunked(q, k, iq, iw, ik, scale=0.3, query_rows=rows, chunk_size=2)
    syncs = [e for e in prof.events() if e.name in ("aten::item", "aten::_local_scalar_dense")]
    assert not syncs and torch.isfinite(loss)


def test_the_chunk_budget_is_larger_on_cuda_and_bounded():
    from dsv32.dsa.loss import LOSS_CHUNK_ELEMS, LOSS_CHUNK_ELEMS_CUDA, _default_chunk

    heads, width = 9 + 16, 8192  # SmolLM2's 9 heads + 16 indexer heads at 8K tokens (smollm2-gpu.toml)
    cpu, cuda = _default_chunk(heads, width, "cpu"), _default_chunk(heads, width, torch.device("cuda"))
    assert cpu * heads * width <= LOSS_CHUNK_ELEMS and cuda * heads * width <= LOSS_CHUNK_ELEMS_CUDA
    assert cuda >= 16 * cpu and -(-8192 // cuda) <= 64  # at most 64 chunks per layer at 8K tokens
