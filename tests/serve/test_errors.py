"""Every refusal is OpenAI's error JSON with the right status, through the openai client; bad input
never gives a 500 and never stops the server."""

from __future__ import annotations

import threading

import httpx2 as httpx
import openai
import pytest
from helpers import v32_model as V
from helpers.serve import client_for, wait_for

MODEL = "tiny-v32"
USER = [{"role": "user", "content": "hi"}]


def _tool(name: str, parameters: dict | None = None) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters or {"type": "object"}}}


def _error(call) -> tuple[int, dict]:
    with pytest.raises(openai.APIStatusError) as info:
        call()
    body = info.value.body
    assert set(body) == {"message", "type", "param", "code"}, body
    return info.value.status_code, body


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
        ({"messages": [{"role": "user"}]}, "messages"),
        (
            {
                "messages": [
                    *USER,
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"type": "function", "function": {"name": "f", "arguments": "{not json"}}
                        ],
                    },
                ]
            },
            "messages",
        ),
        (
            {"messages": [*USER, {"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]},
            "messages",
        ),
        ({"messages": [{"role": "tool", "content": "orphan result"}]}, "messages"),
        (
            {"messages": USER, "tools": [{"type": "function", "function": {"description": "no name"}}]},
            "tools",
        ),
        ({"messages": USER, "tools": [{"type": "retrieval"}]}, "tools"),
        ({"messages": USER, "temperature": -1}, "temperature"),
        ({"messages": USER, "top_p": 0}, "top_p"),
        ({"messages": USER, "max_tokens": 0}, "max_tokens"),
        ({"messages": USER, "n": 5}, "n"),
        ({"messages": USER, "top_logprobs": 3}, None),
        ({"messages": USER, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"messages": []}, "messages"),
        (
            {"messages": USER, "extra_body": {"chat_template_kwargs": {"thinking_budget": 3}}},
            "chat_template_kwargs",
        ),
        ({"messages": USER, "frequency_penalty": 0.5}, "frequency_penalty"),
        ({"messages": USER, "seed": 2**64}, "seed"),
        ({"messages": USER, "max_tokens": "5"}, "max_tokens"),
        ({"messages": USER, "max_tokens": True}, "max_tokens"),
        ({"messages": USER, "response_format": {"type": "xml"}}, "response_format"),
        ({"messages": USER, "response_format": {"type": "json_schema"}}, "response_format"),
        ({"messages": USER, "tools": [_tool("f"), _tool("f")]}, None),
        ({"messages": USER, "tools": [_tool("f", {"type": "banana", "properties": 5})]}, "tools"),
        ({"messages": USER, "tools": [_tool('say "hi"')]}, "tools"),
        ({"messages": USER, "tools": [_tool("a\nb")]}, "tools"),
    ],
)
def test_invalid_requests_are_400(v32_server, kwargs, param):
    client = client_for(v32_server)
    status, body = _error(lambda: client.chat.completions.create(model=MODEL, **kwargs))
    assert status == 400 and body["type"] == "invalid_request_error"
    if param:
        assert body["param"] == param, body


def test_a_message_error_counts_the_requests_own_messages_when_tools_are_given(v32_server):
    client = client_for(v32_server)
    bad = {
        "role": "assistant",
        "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{x"}}],
    }
    for tools in ({}, {"tools": [_tool("f")]}):
        status, body = _error(
            lambda tools=tools: client.chat.completions.create(model=MODEL, messages=[*USER, bad], **tools)
        )
        assert status == 400 and body["message"].startswith("message 1: tool call 0 (f)"), body


def test_a_bug_in_a_handler_is_a_500_in_openai_json_and_the_server_keeps_serving(
    v32_server, v32_served, monkeypatch
):
    def broken(request):
        raise RuntimeError("a bug")

    monkeypatch.setattr(v32_served, "chat_prompt", broken)
    client = client_for(v32_server)
    status, body = _error(lambda: client.chat.completions.create(model=MODEL, messages=USER))
    assert status == 500 and body["type"] == "server_error" and "RuntimeError: a bug" in body["message"]
    monkeypatch.undo()
    r = client.chat.completions.create(model=MODEL, messages=V.QUESTION, temperature=0)
    assert r.choices[0].message.content == V.CHAT_ANSWER


def test_the_largest_seed_samples_every_choice(v32_server):
    r = client_for(v32_server).chat.completions.create(
        model=MODEL, messages=V.QUESTION, seed=2**63 - 1, n=2, max_tokens=3, temperature=1.0
    )
    assert [c.finish_reason for c in r.choices] == ["length", "length"]


def test_context_length_exceeded(v32_server):
    client = client_for(v32_server)
    status, body = _error(lambda: client.chat.completions.create(model=MODEL, messages=USER, max_tokens=5000))
    assert status == 400 and body["code"] == "context_length_exceeded" and "4096" in body["message"]
    long = [{"role": "user", "content": "x" * 5000}]
    status, body = _error(lambda: client.chat.completions.create(model=MODEL, messages=long))
    assert body["code"] == "context_length_exceeded"


def test_unknown_model_is_404(v32_server):
    client = client_for(v32_server)
    status, body = _error(lambda: client.chat.completions.create(model="gpt-9", messages=USER))
    assert status == 404 and body["code"] == "model_not_found"
    assert [m.id for m in client.models.list()] == [MODEL]


def test_malformed_bodies_are_400_and_the_server_keeps_serving(v32_server):
    url = v32_server.base_url + "/chat/completions"
    broken = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert broken.status_code == 400 and broken.json()["error"]["param"] is None
    assert "the body is not valid JSON (at character 1" in broken.json()["error"]["message"]
    assert httpx.post(url, json={"model": MODEL, "messages": "hi"}).status_code == 400
    assert httpx.post(url, json={"model": MODEL, "messages": USER, "bogus": 1}).status_code == 400
    assert httpx.get(v32_server.base_url.removesuffix("/v1") + "/health").json() == {"status": "ok"}
    r = client_for(v32_server).chat.completions.create(model=MODEL, messages=V.QUESTION, temperature=0)
    assert r.choices[0].message.content == V.CHAT_ANSWER


@pytest.fixture(scope="module")
def guarded(one_thread):
    """tiny-llama behind an API key, one batch row and one queue place."""
    from dsv32.serve import ServerThread, create_app, load_served

    served = load_served("tiny-llama", device="cpu")
    # The random model often samples its end token within a few hundred tokens (well under a second):
    # without one, a request holds its row until max_tokens, so the queue test's race cannot be lost.
    served.eos_ids = []
    with ServerThread(create_app(served, max_batch=1, max_queue=1, api_key="sekret")) as server:
        yield server


def test_wrong_api_key_is_401(guarded):
    status, body = _error(lambda: client_for(guarded, api_key="wrong").models.list())
    assert status == 401 and body["code"] == "invalid_api_key"
    assert [m.id for m in client_for(guarded, api_key="sekret").models.list()] == ["tiny-llama"]


def _metric(server, name: str) -> float:
    text = httpx.get(server.base_url.removesuffix("/v1") + "/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(f"dsv32_{name}"))


def test_full_queue_is_503_and_a_disconnect_frees_the_slot(guarded):
    client = client_for(guarded, api_key="sekret")
    stream = client.completions.create(model="tiny-llama", prompt="abc", max_tokens=1000, stream=True)
    next(iter(stream))  # the one batch row is busy
    waiting = threading.Thread(
        target=lambda: client.completions.create(model="tiny-llama", prompt="xyz", max_tokens=2), daemon=True
    )
    waiting.start()
    wait_for(lambda: _metric(guarded, "waiting_requests") == 1)
    status, body = _error(lambda: client.completions.create(model="tiny-llama", prompt="q", max_tokens=2))
    assert status == 503 and body["code"] == "queue_full"
    stream.close()  # the client goes away mid-stream: its row is freed and the waiting request runs
    waiting.join(timeout=60)
    assert not waiting.is_alive()
    wait_for(lambda: _metric(guarded, "running_rows") == 0)
    assert _metric(guarded, "generation_tokens_total") < 1000


def _fails_beside_a_running_request(served, make_job) -> object:
    """Submit ``make_job(put)`` while another request decodes; return its one event (it must be a
    Failed) after checking that the running request still finished."""
    import queue

    from dsv32.engine.sampling import SamplingParams
    from dsv32.serve import scheduler as S

    running, refused = queue.Queue(), queue.Queue()
    scheduler = S.Scheduler(served)
    scheduler.start()
    try:
        scheduler.submit(S.Job([1, 2, 3], 40, SamplingParams(temperature=1.0), running.put, seed=1))
        assert isinstance(running.get(timeout=30), S.Chunk)  # it is in the batch
        scheduler.submit(make_job(refused.put))
        failed = refused.get(timeout=30)
        event = running.get(timeout=30)
        while not isinstance(event, S.Finished | S.Failed):
            event = running.get(timeout=30)
        assert isinstance(event, S.Finished)  # the running request was not failed with it
    finally:
        scheduler.stop()
    assert isinstance(failed, S.Failed) and refused.empty()  # one Failed, also for a job of n rows
    return failed


def test_a_prompt_that_fails_to_prefill_fails_its_request_once(v32_served, monkeypatch):
    import queue

    from dsv32.engine.batch import RunningBatch
    from dsv32.engine.sampling import SamplingParams
    from dsv32.serve.scheduler import Failed, Job, Scheduler

    def out_of_memory(self, *args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(RunningBatch, "prefill", out_of_memory)
    events: queue.Queue = queue.Queue()
    scheduler = Scheduler(v32_served)
    scheduler.start()
    try:
        scheduler.submit(Job([1, 2, 3], 4, SamplingParams(temperature=0.0), events.put, n=2))
        assert events.get(timeout=30) == Failed("generation failed: RuntimeError: out of memory")
    finally:
        scheduler.stop()
    assert events.empty()  # one Failed for the job's two rows, none at shutdown


def test_a_request_that_cannot_join_fails_alone_and_the_batch_goes_on(v32_served, monkeypatch):
    from dsv32.engine.sampling import SamplingParams
    from dsv32.serve import scheduler as S

    class PickyRow(S._Row):
        def __init__(self, job, *args):
            if job.seed == 13:
                raise ValueError("no generator for this seed")
            super().__init__(job, *args)

    monkeypatch.setattr(S, "_Row", PickyRow)
    failed = _fails_beside_a_running_request(
        v32_served, lambda put: S.Job([4, 5], 4, SamplingParams(temperature=1.0), put, seed=13)
    )
    assert failed == S.Failed("generation failed: ValueError: no generator for this seed")


def test_a_temperature_below_1e_5_decodes_greedily(v32_server):
    client = client_for(v32_server)
    texts = [
        client.completions.create(model=MODEL, prompt="hello", max_tokens=8, temperature=t).choices[0].text
        for t in (0.0, 1e-40)
    ]
    assert texts[0] == texts[1]


def test_a_row_that_cannot_be_sampled_fails_only_its_request(v32_served, monkeypatch):
    from dsv32.engine import batch as B
    from dsv32.engine.sampling import SamplingParams
    from dsv32.serve import scheduler as S

    real = B.sample_next

    def picky(logits, params, generator=None):
        if params.top_k == 3:
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
        return real(logits, params, generator)

    monkeypatch.setattr(B, "sample_next", picky)
    failed = _fails_beside_a_running_request(
        v32_served, lambda put: S.Job([4, 5], 4, SamplingParams(temperature=1.0, top_k=3), put, n=2)
    )
    assert "RuntimeError: probability tensor" in failed.message


def test_a_prompt_that_fails_to_prefill_fails_alone_and_the_batch_goes_on(v32_served):
    from dsv32.engine.sampling import SamplingParams
    from dsv32.serve import scheduler as S

    outside = v32_served.model.config.vocab_size + 5  # the embedding has no such row
    failed = _fails_beside_a_running_request(
        v32_served, lambda put: S.Job([4, outside], 4, SamplingParams(temperature=0.0), put, n=2)
    )
    assert "IndexError" in failed.message


def test_prompt_ids_are_checked_against_the_models_vocabulary_not_the_tokenizers(one_thread):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from dsv32.engine.models import ByteTokenizer, LoadedModel
    from dsv32.serve import ServedModel, ServerThread, create_app

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=200, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    tokenizer = ByteTokenizer()  # 257 ids: more than the model embeds
    served = ServedModel(LoadedModel(LlamaForCausalLM(config), tokenizer, "hf"), "small-vocab")
    with ServerThread(create_app(served, max_batch=2)) as server:
        client = client_for(server)
        status, body = _error(lambda: client.completions.create(model="small-vocab", prompt=[5, 230]))
        assert status == 400 and body["param"] == "prompt" and "[0, 200)" in body["message"]
        ok = client.completions.create(model="small-vocab", prompt=[5, 199], max_tokens=3, temperature=0)
        assert ok.usage.completion_tokens >= 1
