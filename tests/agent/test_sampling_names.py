"""Every backend takes the same sampling names (``max_tokens``, ``temperature``, ``top_p``, ``top_k``,
``seed``) in its constructor and per call; ``max_new_tokens`` is an alias of ``max_tokens``, and the
two disagreeing is an error that says so."""

from __future__ import annotations

import pytest
import torch
from helpers.agent import completion

from dsv32.agent import AgentError, LocalBackend, OpenAIBackend
from dsv32.engine.models import tiny_native_config
from dsv32.model import DeepseekV32

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tiny(v32_tokenizer):
    torch.manual_seed(0)
    config = tiny_native_config(vocab_size=len(v32_tokenizer), max_position_embeddings=4096)
    return DeepseekV32(config).eval()


def test_the_local_backend_takes_max_tokens_and_its_alias(tiny, v32_tokenizer):
    backend = LocalBackend(tiny, v32_tokenizer, max_tokens=7, temperature=0.0, top_p=0.9, top_k=5, seed=1)
    assert backend.reply_budget() == 7 and backend.defaults["top_k"] == 5
    assert LocalBackend(tiny, v32_tokenizer, max_new_tokens=9).reply_budget() == 9
    assert LocalBackend(tiny, v32_tokenizer).reply_budget() == 1024
    assert backend.reply_budget({"max_new_tokens": 3}) == backend.reply_budget({"max_tokens": 3}) == 3
    reply = backend.complete(USER, [], thinking=False, sampling={"max_tokens": 2})
    assert reply.usage.completion_tokens <= 2
    with pytest.raises(AgentError, match="max_tokens=4 and max_new_tokens=5 disagree"):
        LocalBackend(tiny, v32_tokenizer, max_tokens=4, max_new_tokens=5)
    with pytest.raises(AgentError, match=r"does not know the sampling setting\(s\) \['min_p'\]; it takes \["):
        backend.complete(USER, [], thinking=False, sampling={"min_p": 0.1})


def test_the_openai_backend_sends_the_alias_as_max_tokens(stub):
    stub.reply(completion({"content": "ok"}))
    stub.reply(completion({"content": "ok"}))
    backend = OpenAIBackend(stub.url, "m", max_new_tokens=12, temperature=0.5, top_k=4, seed=3)
    assert backend.reply_budget() == 12
    backend.complete(USER, [], thinking=False)
    sent = stub.requests[-1]
    assert sent["max_tokens"] == 12 and "max_new_tokens" not in sent
    assert sent["temperature"] == 0.5 and sent["top_k"] == 4 and sent["seed"] == 3
    backend.complete(USER, [], thinking=False, sampling={"max_new_tokens": 5})
    assert stub.requests[-1]["max_tokens"] == 5
    with pytest.raises(AgentError, match="disagree"):
        OpenAIBackend(stub.url, "m", max_tokens=1, max_new_tokens=2)
