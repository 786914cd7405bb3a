"""The rollout engine's wire format (:mod:`dsv32.engine.wire`): the shared sampling bounds, strict
token ids, the fields a request was given sent as they were, replies read with what vLLM adds."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from dsv32.engine.wire import (
    GenerateParams,
    GenerateRequest,
    GenerateResponse,
    InitTransferRequest,
    UpdateWeightsRequest,
    as_version,
    engine_top_k,
    problems,
)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"seed": 2**63}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"top_k": -2}, "top_k"),
        ({"temperature": 2.01}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": float("inf")}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2.0}, "max_tokens"),
        ({"seed": True}, "seed"),
        ({"stop_token_ids": ["1"]}, "stop_token_ids"),
        ({"logprobs": -1}, "logprobs"),
    ],
)
def test_sampling_params_out_of_bounds_are_refused(params, field):
    with pytest.raises(ValidationError) as info:
        GenerateParams(**params)
    assert problems(info.value).startswith(field)


def test_the_sampling_bounds_accept_their_edges_and_both_words_for_off():
    p = GenerateParams(seed=-(2**63), temperature=2, top_p=1, top_k=-1, max_tokens=1)
    assert p.seed == -(2**63) and p.temperature == 2.0
    assert GenerateParams(seed=2**63 - 1).seed == 2**63 - 1
    assert [engine_top_k(k) for k in (-1, 0, 5)] == [0, 0, 5]


@pytest.mark.parametrize(
    ("token_ids", "message"),
    [
        (["1", "2"], "token_ids[0] is '1'"),
        ([1, 2.0], "token_ids[1] is 2.0"),
        ([[1], [False]], "token_ids[1][0] is False"),
        ([[1], 2], "item 1 is not a list"),
        ({"a": 1}, "a list of token ids"),
    ],
)
def test_token_ids_are_json_integers_and_the_message_says_where(token_ids, message):
    with pytest.raises(ValidationError, match=message.replace("[", r"\[").replace("]", r"\]")):
        GenerateRequest(token_ids=token_ids)


def test_a_batch_and_one_prompt():
    one = GenerateRequest(token_ids=[1, 2])
    batch = GenerateRequest(token_ids=[[1, 2], [3]])
    assert (one.batched, one.prompts) == (False, [[1, 2]])
    assert (batch.batched, batch.prompts) == (True, [[1, 2], [3]])


def test_a_request_is_sent_with_the_fields_it_was_given_in_order():
    body = GenerateRequest(
        model="m",
        token_ids=[[1]],
        sampling_params=GenerateParams(max_tokens=2, temperature=0.5, seed=None),
        stream=False,
    )
    assert json.dumps(body.model_dump(exclude_unset=True)) == json.dumps(
        {
            "model": "m",
            "token_ids": [[1]],
            "sampling_params": {"max_tokens": 2, "temperature": 0.5, "seed": None},
            "stream": False,
        }
    )
    update = UpdateWeightsRequest(path="/w", weight_version=3).model_dump(exclude_unset=True)
    assert update == {"path": "/w", "weight_version": 3}


def test_replies_read_what_vllm_adds_and_ignore_what_this_side_does_not_use():
    reply = GenerateResponse.model_validate(
        {
            "request_id": "x",
            "choices": [
                {
                    "index": 0,
                    "token_ids": [5, 6],
                    "logprobs": {"content": [{"token": "a", "logprob": -1, "top_logprobs": []}] * 2},
                    "routed_experts": "AAAA",
                    "weight_versions": [{"version": "4", "start": 0, "end": 2}],
                }
            ],
        }
    )
    choice = reply.choices[0]
    assert choice.sampling_logprobs() == [-1.0, -1.0] and choice.routed_experts == "AAAA"
    assert as_version(choice.weight_versions[0].version) == 4
    assert as_version("policy-a") is None and as_version(None) is None and as_version(7) == 7
    short = choice.model_copy(update={"token_ids": [5, 6, 7]})
    assert short.sampling_logprobs() is None  # not one per generated token


@pytest.mark.parametrize(
    "body",
    [
        {"master_address": "", "master_port": 1},
        {"master_address": "a b", "master_port": 1},
        {"master_address": "h", "master_port": 0},
        {"master_address": "h", "master_port": 1, "backend": "mpi"},
        {"master_address": "h", "master_port": 1, "timeout": 601},
        {"master_address": "h", "master_port": "80"},
    ],
)
def test_init_transfer_bodies_are_checked(body):
    with pytest.raises(ValidationError):
        InitTransferRequest.model_validate(body)
    ok = InitTransferRequest(master_address="::1", master_port=80, backend="gloo", timeout=1)
    assert ok.timeout == 1.0
