"""``dsv32 serve --dtype``: the flag, the served model's dtype, and a bf16 server's log-probs, which are
the fp32 log-softmax of the model's bf16 logits."""

from __future__ import annotations

import pytest
import torch
from helpers.serve import client_for

from dsv32.cli import build_parser
from dsv32.engine.backends import backend_for
from dsv32.serve import ServerThread, create_app, load_served


def test_the_serve_flag_takes_the_dtypes_and_defaults_to_auto(capsys):
    parser = build_parser()
    assert parser.parse_args(["serve", "tiny-native"]).dtype == "auto"
    assert parser.parse_args(["serve", "tiny-native", "--dtype", "bfloat16"]).dtype == "bfloat16"
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "tiny-native", "--dtype", "fp16"])
    assert "invalid choice: 'fp16'" in capsys.readouterr().err


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_served_model_runs_in_its_dtype(dtype):
    served = load_served("tiny-native", device="cpu", dtype=dtype)
    assert served.dtype == dtype
    assert served.model.lm_head.weight.dtype is getattr(torch, dtype)


def test_a_bf16_server_reports_fp32_logprobs_of_its_bf16_logits(one_thread):
    served = load_served("tiny-native", device="cpu", dtype="bfloat16")
    prompt = "abc"
    ids = torch.tensor([served.encode(prompt)])
    with torch.no_grad():
        logits = backend_for(served.model).prefill(ids, torch.ones_like(ids), max_len=ids.shape[1] + 1)
    assert logits.dtype is torch.bfloat16
    want = logits[0].float().log_softmax(-1)
    with ServerThread(create_app(served, max_batch=2)) as server:
        r = client_for(server).completions.create(
            model=served.name, prompt=prompt, max_tokens=1, temperature=0, logprobs=3
        )
    first = r.choices[0].logprobs
    token = int(want.argmax())
    assert abs(first.token_logprobs[0] - float(want[token])) < 1e-5
    top = sorted(first.top_logprobs[0].values(), reverse=True)
    torch.testing.assert_close(torch.tensor(top), want.topk(3).values, atol=1e-5, rtol=0)


def test_a_rollout_engine_samples_in_the_trainers_dtype_unless_bf16_is_asked_for():
    from dsv32.cli.serve import serve_dtype

    assert serve_dtype("auto", rl_routes=True) == "float32"  # on policy against an fp32 trainer
    assert serve_dtype("bfloat16", rl_routes=True) == "bfloat16"
    assert serve_dtype("auto", rl_routes=False) == "auto"
    assert serve_dtype("float32", rl_routes=False) == "float32"
