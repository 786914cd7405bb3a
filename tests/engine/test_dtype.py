"""The engine's dtype: names and their errors, ``auto`` and the fast-bf16 detector, bf16 matmuls that
accumulate in fp32, models loaded and cast in bf16, and sampling records (log-probs, kept sets)
computed in fp32 from bf16 logits."""

from __future__ import annotations

import logging

import pytest
import torch

from dsv32.engine import SamplingParams, generate, kept_logprobs, sample_next
from dsv32.engine import dtype as D
from dsv32.engine.models import load_model


@pytest.fixture
def detector(monkeypatch):
    """Set what the fast-bf16 detector answers for the CPU."""

    def answer(fast: bool) -> None:
        monkeypatch.setattr(D, "cpu_has_fast_bf16", lambda: fast)

    return answer


def test_a_dtype_name_outside_the_choices_is_a_typed_error():
    for bad in ("fp16", "bf16", "float16", "", None):
        with pytest.raises(D.DtypeError, match="not one of auto, float32, bfloat16"):
            D.resolve_dtype(bad)
    with pytest.raises(D.DtypeError):
        load_model("tiny-llama", device="cpu", dtype="half")
    assert issubclass(D.DtypeError, ValueError)


def test_auto_is_bf16_where_the_cpu_has_native_bf16_and_fp32_with_a_message_elsewhere(detector, caplog):
    detector(True)
    assert D.resolve_dtype("auto", "cpu") is torch.bfloat16
    detector(False)
    with caplog.at_level(logging.INFO, logger="dsv32.engine.dtype"):
        assert D.resolve_dtype("auto", "cpu") is torch.float32
    (record,) = caplog.records
    assert record.levelno == logging.INFO and "dtype auto: float32" in record.getMessage()
    assert "\n" not in record.getMessage() and "no native bf16" in record.getMessage()


def test_explicit_bf16_on_a_cpu_without_native_bf16_runs_and_warns(detector, caplog):
    detector(False)
    with caplog.at_level(logging.INFO, logger="dsv32.engine.dtype"):
        loaded = load_model("tiny-llama", device="cpu", dtype="bfloat16")
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "slower than float32" in caplog.records[0].getMessage()
    assert loaded.model.dtype is torch.bfloat16
    out = generate(loaded.model, [[1, 2, 3]], max_new_tokens=2, temperature=0.0)
    assert out.tokens.shape == (1, 2)
    detector(True)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="dsv32.engine.dtype"):
        D.resolve_dtype("bfloat16", "cpu")
        D.resolve_dtype("float32", "cpu")
    assert not caplog.records  # nothing to say where bf16 is native, nor for float32


def test_the_cpu_detector_reads_the_cpuinfo_flags_where_torch_has_no_check(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", None, raising=False)
    for flags, fast in (
        ("fpu avx2 fma", False),
        ("fpu avx512f avx512_bf16", True),
        ("amx_bf16 amx_tile", True),
    ):
        monkeypatch.setattr(D, "_cpuinfo_flags", lambda flags=flags: set(flags.split()))
        D.cpu_has_fast_bf16.cache_clear()
        assert D.cpu_has_fast_bf16() is fast
    D.cpu_has_fast_bf16.cache_clear()


def test_bf16_matmuls_accumulate_in_fp32():
    """A bf16 accumulator would drift by many bf16 ulps over 4096 products; the engine's matmuls are
    the exact sum of the bf16 inputs' products rounded once to bf16."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(4, 4096, generator=g).bfloat16()
    w = torch.randn(64, 4096, generator=g).bfloat16()
    out = torch.nn.functional.linear(a, w)
    exact = a.double() @ w.double().T
    assert out.dtype is torch.bfloat16
    ulp = exact.abs() * 2.0**-7  # one bf16 ulp (8 significant bits)
    assert ((out.double() - exact).abs() <= ulp).all()


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-native"])
def test_models_load_in_bf16_with_their_fp32_parameters_kept(name):
    model = load_model(name, device="cpu", dtype="bfloat16").model
    kept = D.fp32_kept(model)
    for pname, p in model.named_parameters():
        want = torch.float32 if D._kept(pname, kept) else torch.bfloat16
        assert p.dtype is want, pname
    assert D.model_dtype(model) is torch.bfloat16
    if name == "tiny-native":
        assert any(p.dtype is torch.float32 for p in model.parameters())  # the indexer's gates


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-native"])
def test_bf16_generation_records_fp32_logprobs_of_the_bf16_logits(name):
    """The sampling log-probs and kept sets are those of the fp32 upcast of the bf16 logits: exactly
    what the sampler computes on ``logits.float()``."""
    model = load_model(name, device="cpu", dtype="bfloat16").model
    prompts = [[5, 6, 7, 8], [9, 10]]
    params = dict(temperature=0.9, top_p=0.9, top_k=20)
    out = generate(
        model, prompts, max_new_tokens=5, **params, return_kept=True,
        generator=torch.Generator().manual_seed(0), eos_token_id=[],
    )  # fmt: skip
    assert out.logprobs.dtype is torch.float32
    # replay: the bf16 model's logits at every position, upcast, renormalized over the kept sets
    logits = model(out.sequences[:, :-1], attention_mask=out.attention_mask[:, :-1]).logits
    P = out.sequences.shape[1] - out.tokens.shape[1]
    step_logits = logits[:, P - 1 :]
    assert step_logits.dtype is torch.bfloat16
    replay = kept_logprobs(step_logits.float(), out.kept_token_ids, params["temperature"])
    at = (out.kept_token_ids == out.tokens[..., None]).int().argmax(-1, keepdim=True)
    torch.testing.assert_close(replay.gather(-1, at)[..., 0], out.logprobs, atol=0.05, rtol=0)
    # one step, exactly: sample_next on bf16 logits = on their fp32 upcast, and in fp32
    bf16 = (torch.randn(3, 257, generator=torch.Generator().manual_seed(1)) * 4).bfloat16()
    for p in (SamplingParams(**params), SamplingParams(temperature=0.0)):
        a = sample_next(bf16, p, torch.Generator().manual_seed(2))
        b = sample_next(bf16.float(), p, torch.Generator().manual_seed(2))
        assert a[1].dtype is torch.float32
        for x, y in zip(a, b):
            assert torch.equal(x, y)
    greedy = sample_next(bf16, SamplingParams(temperature=0.0))[1]
    want = bf16.float().log_softmax(-1).gather(-1, bf16.float().argmax(-1, keepdim=True))[:, 0]
    torch.testing.assert_close(greedy, want, rtol=0, atol=1e-6)


def test_cast_copy_and_weight_copy_between_dtypes():
    src = load_model("tiny-native", device="cpu").model
    copy = D.cast_model(load_model("tiny-native", device="cpu").model, torch.bfloat16)
    with torch.no_grad():
        for p in src.parameters():
            p.add_(0.01)
    D.copy_weights(copy, src)
    theirs = dict(src.named_parameters())
    for name, p in copy.named_parameters():
        assert torch.equal(p, theirs[name].to(p.dtype)), name
    other = load_model("tiny-llama", device="cpu").model
    with pytest.raises(ValueError, match="different tensors"):
        D.copy_weights(other, src)
