"""Every fast DSA path equals its readable torch reference (fp32) on random shapes: chunk sizes that do
not divide L, k >= L, batch > 1, padded batches, decode against a cache, strided cache views, ties."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv32 import dsa
from dsv32.dsa import (
    index_scores,
    indexer_topk,
    select_topk,
    sparse_attention,
    sparse_attention_reference,
    sparse_mla_attention,
    sparse_mla_attention_reference,
)
from dsv32.dsa.union import UNION_BLOCK

FAST = settings(max_examples=60, deadline=None, derandomize=True)


def _padding(B: int, S: int, g: torch.Generator) -> torch.Tensor:
    """Left padding of random length per row (row 0 may be all padding)."""
    lengths = torch.randint(0, S + 1, (B,), generator=g)
    return torch.arange(S).unsqueeze(0) >= (S - lengths).unsqueeze(1)


def _sets(idx: torch.Tensor) -> torch.Tensor:
    return idx.sort(dim=-1).values


@st.composite
def indexer_case(draw):
    B = draw(st.integers(1, 3))
    T = draw(st.integers(1, 70))
    S = T + draw(st.sampled_from([0, 0, 1, 9, 40]))  # prefill, or queries continuing a cache
    return dict(
        B=B, T=T, S=S, H=draw(st.integers(1, 4)), D=draw(st.sampled_from([4, 8])),
        topk=draw(st.integers(1, S + 8)), chunk=draw(st.integers(1, 33)), key_block=draw(st.integers(1, 17)),
        window=draw(st.integers(1, 90)), ties=draw(st.booleans()), padded=draw(st.booleans()),
        positive_gates=draw(st.booleans()), seed=draw(st.integers(0, 2**16)),
    )  # fmt: skip


@FAST
@given(indexer_case())
def test_chunked_streaming_indexer_equals_reference(c):
    g = torch.Generator().manual_seed(c["seed"])
    q = torch.randn(c["B"], c["T"], c["H"], c["D"], generator=g)
    w = torch.randn(c["B"], c["T"], c["H"], generator=g)
    k = torch.randn(c["B"], c["S"], c["D"], generator=g)
    if c["positive_gates"]:
        w = w.abs()
    if c["ties"]:  # small integers: exact ties everywhere, including ReLU zeros
        q, w, k = q.round(), w.round(), k.round()
    pad = _padding(c["B"], c["S"], g) if c["padded"] else None
    expected = select_topk(index_scores(q, w, k), c["topk"], key_padding_mask=pad)
    got = indexer_topk(
        q, w, k, c["topk"], key_padding_mask=pad, chunk_size=c["chunk"], key_block=c["key_block"],
        window=c["window"],
    )  # fmt: skip
    assert got.shape == expected.shape == (c["B"], c["T"], min(c["topk"], c["S"]))
    assert torch.equal(_sets(got), _sets(expected))


@pytest.mark.parametrize(("T", "topk"), [(300, 40), (700, 9)])  # (700, 9): coarse-to-fine row top-k
def test_indexer_defaults_long_rows_and_decode_agree(T, topk):
    """Default knobs at a length with several chunks, and one decode query per position selecting
    exactly what the prefill selected for that position (ties included)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, T, 4, 16, generator=g).round()
    w = torch.randn(2, T, 4, generator=g)
    k = torch.randn(2, T, 16, generator=g).round()
    prefill = indexer_topk(q, w, k, topk)
    assert torch.equal(_sets(prefill), _sets(select_topk(index_scores(q, w, k), topk)))
    for t in (0, topk - 1, topk, topk + 1, 157, T - 1):  # around k, and far beyond it
        decode = indexer_topk(q[:, t : t + 1], w[:, t : t + 1], k[:, : t + 1], topk)
        for b in range(2):
            assert set(decode[b, 0].tolist()) - {-1} == set(prefill[b, t].tolist()) - {-1}


def test_indexer_bf16_inputs_select_like_fp32():
    g = torch.Generator().manual_seed(1)
    q, w, k = (
        torch.randn(2, 50, 3, 8, generator=g),
        torch.randn(2, 50, 3, generator=g),
        torch.randn(2, 50, 8, generator=g),
    )
    qb, kb = q.bfloat16(), k.bfloat16()
    got = indexer_topk(qb, w, kb, 7, chunk_size=16)
    assert torch.equal(_sets(got), _sets(select_topk(index_scores(qb, w, kb), 7)))


def test_indexer_rejects_bad_shapes():
    with pytest.raises(ValueError, match="only 3 keys"):
        indexer_topk(torch.randn(1, 5, 2, 4), torch.randn(1, 5, 2), torch.randn(1, 3, 4), 2)
    with pytest.raises(ValueError, match="expects q"):
        indexer_topk(torch.randn(5, 2, 4), torch.randn(5, 2), torch.randn(1, 5, 4), 2)


@st.composite
def attention_case(draw):
    B = draw(st.integers(1, 3))
    T = draw(st.integers(1, 40))
    S = T + draw(st.sampled_from([0, 0, 3, 50]))
    return dict(
        B=B, T=T, S=S, Hkv=draw(st.integers(1, 3)), G=draw(st.integers(1, 3)), D=draw(st.sampled_from([4, 8])),
        Dv=draw(st.integers(1, 9)), topk=draw(st.integers(1, S + 6)), chunk=draw(st.integers(1, 23)),
        padded=draw(st.booleans()), layout=draw(st.sampled_from(["token", "head", "cache"])),
        overlap=draw(st.booleans()), union=draw(st.sampled_from(UNION_RATIOS)), seed=draw(st.integers(0, 2**16)),
    )  # fmt: skip


# union_ratio of the fast paths: the default, never (per-query gathers only), always (every block over
# its selections' union), and a small ratio that mixes both paths within one call.
UNION_RATIOS = [None, 0.0, float("inf"), 1.5]


def _selection(B, T, S, topk, padded, g, overlap=False):
    """``select_topk`` of random scores; with ``overlap`` the scores share a per-key component, so
    neighbouring queries select mostly the same keys (as a trained indexer's do)."""
    pad = _padding(B, S, g) if padded else None
    scores = torch.randn(B, T, S, generator=g)
    if overlap:
        scores = 0.2 * scores + torch.randn(B, 1, S, generator=g)
    return select_topk(scores, topk, key_padding_mask=pad)


def _keys(B, S, Hkv, D, layout, g):
    """``[B, S, Hkv, D]`` in the layout under test: token-major, a transposed ``[B, Hkv, S, D]``
    tensor, or a slice of a larger preallocated cache (strided over batch and positions)."""
    if layout == "head":
        return torch.randn(B, Hkv, S, D, generator=g).transpose(1, 2)
    if layout == "cache":
        return torch.randn(B, S + 7, Hkv, D, generator=g)[:, 2 : S + 2]
    return torch.randn(B, S, Hkv, D, generator=g)


@FAST
@given(attention_case())
def test_sparse_attention_equals_reference(c):
    g = torch.Generator().manual_seed(c["seed"])
    B, T, S, Hkv, G = c["B"], c["T"], c["S"], c["Hkv"], c["G"]
    idx = _selection(B, T, S, c["topk"], c["padded"], g, c["overlap"])
    q = torch.randn(B, T, Hkv * G, c["D"], generator=g)
    k = _keys(B, S, Hkv, c["D"], c["layout"], g)
    v = _keys(B, S, Hkv, c["Dv"], c["layout"], g)
    expected = sparse_attention_reference(q, k, v, idx, 0.37)
    with torch.no_grad():
        got = sparse_attention(q, k, v, idx, 0.37, chunk_size=c["chunk"], union_ratio=c["union"])
    assert got.shape == (B, T, Hkv * G, c["Dv"])
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-5)


@FAST
@given(attention_case())
def test_sparse_attention_gradients_equal_reference(c):
    """The recompute-in-backward autograd function (per-query gathers and union blocks) against
    autograd through the masked reference."""
    g = torch.Generator().manual_seed(c["seed"])
    B, T, S, Hkv, G = c["B"], c["T"], c["S"], c["Hkv"], c["G"]
    idx = _selection(B, T, S, c["topk"], c["padded"], g, c["overlap"])
    leaves = [
        torch.randn(B, T, Hkv * G, c["D"], generator=g, dtype=torch.float64),
        _keys(B, S, Hkv, c["D"], c["layout"], g).double(),
        _keys(B, S, Hkv, c["Dv"], c["layout"], g).double(),
    ]
    up = torch.randn(B, T, Hkv * G, c["Dv"], generator=g, dtype=torch.float64)
    ref_in = [t.detach().clone().requires_grad_() for t in leaves]
    fast_in = [t.detach().clone().requires_grad_() for t in leaves]
    (sparse_attention_reference(*ref_in, idx, 0.37).double() * up).sum().backward()
    (
        sparse_attention(*fast_in, idx, 0.37, chunk_size=c["chunk"], union_ratio=c["union"]) * up
    ).sum().backward()
    for a, b in zip(ref_in, fast_in):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-5)


def test_sparse_attention_backward_saves_no_gathered_rows():
    """What autograd keeps for the backward is O(q + k + v + out), not O(T · K · D) gathered rows."""
    g = torch.Generator().manual_seed(0)
    B, T, Hkv, G, D, K = 1, 512, 2, 2, 16, 64
    idx = _selection(B, T, T, K, False, g)
    q = torch.randn(B, T, Hkv * G, D, generator=g, requires_grad=True)
    k = torch.randn(B, T, Hkv, D, generator=g, requires_grad=True)
    v = torch.randn(B, T, Hkv, D, generator=g, requires_grad=True)
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = sparse_attention(q, k, v, idx, 0.25, chunk_size=32)
    inputs = sum(t.numel() * t.element_size() for t in (q, k, v, out, idx))
    gathered = T * Hkv * K * 2 * D * 4  # what gather + bmm autograd would keep
    assert sum(saved) < 2 * inputs < gathered / 2
    out.sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))


@st.composite
def mla_case(draw):
    B = draw(st.integers(1, 3))
    T = draw(st.integers(1, 30))
    S = T + draw(st.sampled_from([0, 0, 4, 60]))
    return dict(
        B=B, T=T, S=S, H=draw(st.integers(1, 4)), latent=draw(st.sampled_from([8, 12])),
        rope=draw(st.sampled_from([2, 4])), v_dim=draw(st.integers(1, 8)), topk=draw(st.integers(1, S + 6)),
        chunk=draw(st.integers(1, 19)), padded=draw(st.booleans()), split=draw(st.booleans()),
        overlap=draw(st.booleans()), seed=draw(st.integers(0, 2**16)),
    )  # fmt: skip


@FAST
@given(mla_case())
def test_sparse_mla_attention_equals_reference(c):
    g = torch.Generator().manual_seed(c["seed"])
    B, T, S, H, Cl, R = c["B"], c["T"], c["S"], c["H"], c["latent"], c["rope"]
    idx = _selection(B, T, S, c["topk"], c["padded"], g, c["overlap"])
    q = torch.randn(B, T, H, Cl + R, generator=g)
    cache = torch.randn(B, S + 5, Cl + R + 3, generator=g)  # a preallocated cache, sliced as the model does
    latent, k_rope = cache[:, :S, :Cl], cache[:, :S, Cl : Cl + R]
    expected = sparse_mla_attention_reference(q, torch.cat((latent, k_rope), -1), idx, 0.29, c["v_dim"])
    with torch.no_grad():
        if c["split"]:
            got = sparse_mla_attention(q, latent, idx, 0.29, c["v_dim"], chunk_size=c["chunk"], k_rope=k_rope)
        else:
            got = sparse_mla_attention(
                q, torch.cat((latent, k_rope), -1), idx, 0.29, c["v_dim"], chunk_size=c["chunk"]
            )
    assert got.shape == (B, T, H, c["v_dim"])
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-5)


def test_mla_decode_with_split_cache_equals_reference():
    """One query against a long cache (the k_rope path that never concatenates the cache)."""
    g = torch.Generator().manual_seed(3)
    B, S, H, Cl, R, topk = 2, 200, 4, 16, 4, 24
    cache = torch.randn(B, 256, Cl + R, generator=g)
    q = torch.randn(B, 1, H, Cl + R, generator=g)
    pad = _padding(B, S, g)
    idx = select_topk(torch.randn(B, 1, S, generator=g), topk, key_padding_mask=pad)
    got = sparse_mla_attention(q, cache[:, :S, :Cl], idx, 0.2, Cl, k_rope=cache[:, :S, Cl:])
    torch.testing.assert_close(got, sparse_mla_attention_reference(q, cache[:, :S], idx, 0.2, Cl))


@pytest.mark.parametrize("padded", [True, False])  # unpadded: the causal-dense prefix runs too
def test_gradients_equal_reference(padded):
    g = torch.Generator().manual_seed(4)
    B, T, S, Hkv, G, D = 2, 13, 17, 2, 2, 8
    idx = _selection(B, T, S, 6, padded, g)
    leaves = [
        torch.randn(B, T, Hkv * G, D, generator=g),
        torch.randn(B, S, Hkv, D, generator=g),
        torch.randn(B, S, Hkv, 5, generator=g),
    ]
    ref_in = [t.clone().requires_grad_() for t in leaves]
    fast_in = [t.clone().requires_grad_() for t in leaves]
    up = torch.randn(B, T, Hkv * G, 5, generator=g)
    (sparse_attention_reference(*ref_in, idx, 0.3) * up).sum().backward()
    (sparse_attention(*fast_in, idx, 0.3, chunk_size=4) * up).sum().backward()
    for a, b in zip(ref_in, fast_in):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-5)

    q, kv = torch.randn(B, T, 3, 10, generator=g), torch.randn(B, S, 10, generator=g)
    ref_in = [q.clone().requires_grad_(), kv.clone().requires_grad_()]
    fast_in = [q.clone().requires_grad_(), kv.clone().requires_grad_()]
    up = torch.randn(B, T, 3, 6, generator=g)
    (sparse_mla_attention_reference(*ref_in, idx, 0.3, 6) * up).sum().backward()
    (sparse_mla_attention(*fast_in, idx, 0.3, 6, chunk_size=5) * up).sum().backward()
    for a, b in zip(ref_in, fast_in):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-5)


def test_bf16_fast_paths_track_reference():
    g = torch.Generator().manual_seed(5)
    idx = _selection(2, 20, 30, 8, True, g)
    q, k, v = (
        torch.randn(2, 20, 4, 8, generator=g),
        torch.randn(2, 30, 2, 8, generator=g),
        torch.randn(2, 30, 2, 8, generator=g),
    )
    expected = sparse_attention_reference(q, k, v, idx, 0.3)
    got = sparse_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), idx, 0.3)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, atol=3e-2, rtol=3e-2)
    kv = torch.randn(2, 30, 12, generator=g)
    qm = torch.randn(2, 20, 3, 12, generator=g)
    got = sparse_mla_attention(qm.bfloat16(), kv.bfloat16(), idx, 0.3, 8)
    torch.testing.assert_close(
        got.float(), sparse_mla_attention_reference(qm, kv, idx, 0.3, 8), atol=3e-2, rtol=3e-2
    )


def test_prefer_dense_is_a_length_crossover_for_prefill_only():
    ratio = dsa.DENSE_CROSSOVER_RATIO
    k = 512
    assert dsa.prefer_dense(100, int(ratio * k) - 1, k)
    assert not dsa.prefer_dense(100, int(ratio * k) + 1, k)
    assert not dsa.prefer_dense(1, 10, k)  # decode always gathers
    assert not dsa.prefer_dense(100, 1000, k, crossover_ratio=0)
    assert dsa.prefer_dense(100, 10**9, k, crossover_ratio=float("inf"))
    # MLA's C kernel makes the sparse side faster: its own, lower crossover
    fused = dsa.MLA_KERNEL_CROSSOVER_RATIO
    assert fused < ratio
    between = int((fused + ratio) / 2 * k)
    assert dsa.prefer_dense(100, between, k) and not dsa.prefer_dense(100, between, k, mla_kernel=True)
    # and so does the GQA layout's (Hugging Face models)
    gqa = dsa.GQA_KERNEL_CROSSOVER_RATIO
    assert gqa < ratio
    between = int((gqa + ratio) / 2 * k)
    assert dsa.prefer_dense(100, between, k) and not dsa.prefer_dense(100, between, k, gqa_kernel=True)


def test_mla_dispatch_masked_below_crossover_gather_above(monkeypatch):
    """``sparse_impl="auto"``: the masked-dense path below the crossover, the gather path above, and
    both give what the explicit implementations give."""
    from dsv32.engine.speed import tiny_config
    from dsv32.model import attention as mla_module
    from dsv32.model.attention import MLA
    from dsv32.model.rope import RotaryEmbedding

    cfg = tiny_config(index_topk=8)
    torch.manual_seed(0)
    layer = MLA(cfg, 0).eval()
    rope = RotaryEmbedding(cfg)
    calls = []
    real = mla_module.sparse_mla_attention_absorbed
    monkeypatch.setattr(
        mla_module, "sparse_mla_attention_absorbed", lambda *a, **kw: calls.append(1) or real(*a, **kw)
    )
    for T, gathers in ((20, False), (40, True)):  # crossover at 8 · ratio keys
        layer.dense_crossover_ratio = 3.0
        x = torch.randn(2, T, cfg.hidden_size)
        cos, sin = rope(torch.arange(T).expand(2, T))
        outs = {}
        with torch.no_grad():
            for impl in ("masked", "gather", "auto"):
                layer.sparse_impl = impl
                calls.clear()
                outs[impl] = layer(x, cos, sin)
                used_gather = bool(calls)
        assert used_gather == gathers
        torch.testing.assert_close(outs["auto"], outs["gather"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(outs["masked"], outs["gather"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("overlap", [True, False])
def test_union_blocks_are_taken_by_overlap_and_equal_reference(overlap, monkeypatch):
    """Blocks whose selections overlap (a shared per-key score) run over their union, independent
    selections gather per query; both equal the reference, a row with empty selections included."""
    from dsv32.dsa import attention as attn

    calls = []
    real = attn.union_softmax
    monkeypatch.setattr(attn, "union_softmax", lambda s, m: calls.append(s.shape) or real(s, m))
    g = torch.Generator().manual_seed(5)
    B, T, K = 2, 300, 16
    idx = _selection(B, T, T, K, False, g, overlap)
    idx[1, :40] = -1  # as for padding: these queries select nothing
    q = torch.randn(B, T, 6, 8, generator=g)
    k, v = torch.randn(B, T, 2, 8, generator=g), torch.randn(B, T, 2, 5, generator=g)
    expected = sparse_attention_reference(q, k, v, idx, 0.3)
    with torch.no_grad():
        got = sparse_attention(q, k, v, idx, 0.3, union_ratio=3.0)
        mla = sparse_mla_attention(q[..., :1, :], k[:, :, 0], idx, 0.3, 5)  # MLA: always per-query
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-5)
    assert got[1, :40].abs().max() == 0  # nothing selected → zeros, not NaN
    torch.testing.assert_close(mla, sparse_mla_attention_reference(q[..., :1, :], k[:, :, 0], idx, 0.3, 5))
    if overlap:
        assert len(calls) >= B * (T // UNION_BLOCK - 1)  # (nearly) every block, every row
    else:
        assert not calls  # 64 queries' independent selections of 16 keys: unions over 3·16


def test_union_block_gradients_equal_reference(monkeypatch):
    """Training through union blocks: forward and backward run over the unions (counted) and give the
    reference's gradients, with a row whose first queries select nothing."""
    from dsv32.dsa import union

    calls = []
    real = union.union_scores
    monkeypatch.setattr(union, "union_scores", lambda *a: calls.append(1) or real(*a))
    g = torch.Generator().manual_seed(9)
    B, T, K = 2, 200, 12
    idx = _selection(B, T, T, K, False, g, overlap=True)
    idx[0, :30] = -1
    leaves = [
        torch.randn(B, T, 6, 8, generator=g, dtype=torch.float64),
        torch.randn(B, T, 2, 8, generator=g, dtype=torch.float64),
        torch.randn(B, T, 2, 5, generator=g, dtype=torch.float64),
    ]
    up = torch.randn(B, T, 6, 5, generator=g, dtype=torch.float64)
    ref_in = [t.clone().requires_grad_() for t in leaves]
    fast_in = [t.clone().requires_grad_() for t in leaves]
    (sparse_attention_reference(*ref_in, idx, 0.3).double() * up).sum().backward()
    (sparse_attention(*fast_in, idx, 0.3, union_ratio=3.0) * up).sum().backward()
    for a, b in zip(ref_in, fast_in):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-5)
    assert len(calls) >= 2 * B * (T // UNION_BLOCK - 1)  # forward and backward, (nearly) every block


def test_prefer_dense_has_its_own_crossover_for_training_bounded_by_memory():
    k = 256
    train = dsa.TRAIN_DENSE_CROSSOVER_RATIO
    assert train > dsa.DENSE_CROSSOVER_RATIO
    assert not dsa.prefer_dense(2048, 2048, k)  # inference at the demo's shape gathers
    assert dsa.prefer_dense(2048, 2048, k, training=True)  # training there is cheaper masked
    assert not dsa.prefer_dense(100, int(train * k) + 1, k, training=True)
    assert dsa.prefer_dense(100, int(train * k) - 1, k, training=True)
    assert not dsa.prefer_dense(1, 10, k, training=True)  # one query always gathers
    # the masked path keeps ~4 bytes per (query, key) pair of the layer's batch: bounded
    assert dsa.prefer_dense(8192, 8192, 2048, training=True, batch=4)  # the GPU recipe: 2^28 pairs
    assert not dsa.prefer_dense(8192, 8192, 2048, training=True, batch=5)
    assert not dsa.prefer_dense(100, 1000, k, crossover_ratio=0, training=True)
