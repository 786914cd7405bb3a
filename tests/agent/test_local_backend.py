"""LocalBackend on a tiny random V3.2 model (SmolLM2's tokenizer with the V3.2 tokens) and on
SmolLM2 with its own chat template: the prompt of every step is the format's rendering of the same
history, byte for byte, and the KV cache carries over (prefilled tokens are counted).

The models are random or small, so they are steered: a forward hook on ``lm_head`` makes the sampled
token the next one of a scripted completion (the model still runs every prefill and decode step with
its cache); one test lets SmolLM2 generate freely."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.agent import add
from helpers.puppet import ForcedTokens

from dsv32.agent import Agent, AgentError, BackendError, LocalBackend
from dsv32.chat import attach_tools, encode_messages
from dsv32.engine.models import load_model, tiny_native_config
from dsv32.engine.sampling import SamplingParams
from dsv32.engine.session import Session, common_prefix
from dsv32.model import DeepseekV32

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2", device="cpu")


@pytest.fixture(scope="module")
def tiny_v32(v32_tokenizer):
    torch.manual_seed(0)
    eos = v32_tokenizer.convert_tokens_to_ids("<｜end▁of▁sentence｜>")
    config = tiny_native_config(
        vocab_size=len(v32_tokenizer), eos_token_id=eos, pad_token_id=eos, max_position_embeddings=4096
    )
    return DeepseekV32(config).eval()


class Puppet(ForcedTokens):
    """Forces the next sampled tokens to be those of the scripted texts (one token per forward)."""

    def __init__(self, model, tokenizer) -> None:
        super().__init__(model)
        self.tokenizer = tokenizer

    def say(self, text: str) -> list[int]:
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        self.queue += ids
        return ids


ADD_CALL = {"type": "function", "function": {"name": "add", "arguments": json.dumps({"a": 2, "b": 3})}}


def test_v32_prompts_equal_encode_messages_and_the_cache_is_reused(tiny_v32, v32_tokenizer):
    backend = LocalBackend(tiny_v32, v32_tokenizer, temperature=0.0, max_tokens=200)
    assert backend.format.name == "v32"
    agent = Agent(backend, [add], system="You add numbers.")
    tools = agent.toolbox.schemas
    puppet = Puppet(tiny_v32, v32_tokenizer)
    turns = [
        {"role": "assistant", "content": "", "reasoning_content": "Use the tool.", "tool_calls": [ADD_CALL]},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Again, to check.",
            "tool_calls": [ADD_CALL, ADD_CALL],
        },
        {"role": "assistant", "content": "2 + 3 = 5.", "reasoning_content": "It is 5."},
    ]
    history = agent.initial_messages("What is 2 + 3?")
    completions = []
    for turn, results in zip(turns, (1, 2, 0)):
        # the text the model is made to write is exactly the V3.2 rendering of the turn
        completions.append(
            puppet.say(encode_messages([turn], "thinking", context=attach_tools(history, tools)))
        )
        history = [*history, turn, *[{"role": "tool", "content": "5"}] * results]

    prompts, prefilled = [], []
    original = backend.complete

    def recording(messages, tools_, **kw):
        before = backend.session.prefilled_tokens
        out = original(messages, tools_, **kw)
        expected = encode_messages(attach_tools(messages, tools_), "thinking")
        assert backend.last_prompt == expected  # byte for byte, at every step
        assert backend.last_prompt_ids == v32_tokenizer.encode(expected, add_special_tokens=False)
        assert out.usage.prompt_tokens == len(backend.last_prompt_ids)
        prompts.append(backend.last_prompt_ids)
        prefilled.append(backend.session.prefilled_tokens - before)
        assert out.usage.cached_tokens == len(backend.last_prompt_ids) - prefilled[-1]
        return out

    backend.complete = recording
    traj = agent.run("What is 2 + 3?")
    puppet.remove()
    assert traj.stop_reason == "answer" and traj.final == "2 + 3 = 5."
    assert not any(s.problems for s in traj.steps)
    assert [len(s.tool_calls) for s in traj.steps] == [1, 2, 0]
    assert traj.messages[4]["reasoning_content"] == "Again, to check."  # kept within the turn
    # step 1 prefills the whole prompt; later steps only the last reply's end token and the results
    assert prefilled[0] == len(prompts[0])
    for k in (1, 2):
        cached = len(prompts[k - 1]) + len(completions[k - 1]) - 1
        assert prompts[k][:cached] == prompts[k - 1] + completions[k - 1][:-1]
        assert prefilled[k] == len(prompts[k]) - cached
    assert sum(prefilled) < len(prompts[-1]) + 2 * 40


def test_session_reuse_gives_the_tokens_of_a_fresh_prefill(tiny_v32):
    prompt = list(range(100, 160))
    params = SamplingParams(temperature=0.0)
    kept = Session(tiny_v32)
    first = kept.generate(prompt, max_new_tokens=8, sampling=params, stop_ids=[])
    longer = prompt + first.tokens + list(range(300, 320))
    again = kept.generate(longer, max_new_tokens=8, sampling=params, stop_ids=[])
    fresh = Session(tiny_v32).generate(longer, max_new_tokens=8, sampling=params, stop_ids=[])
    assert again.tokens == fresh.tokens
    assert (again.reused, again.prefilled) == (len(prompt) + 7, 21)
    assert kept.prefilled_tokens == len(prompt) + 21
    # a prompt that diverges earlier keeps only the common prefix; the same prompt re-runs one token
    other = kept.generate([*prompt[:30], 7, 8, 9], max_new_tokens=2, sampling=params, stop_ids=[])
    assert (other.reused, other.prefilled) == (30, 3)
    same = kept.generate([*prompt[:30], 7, 8, 9], max_new_tokens=2, sampling=params, stop_ids=[])
    assert (same.reused, same.prefilled) == (32, 1)
    assert common_prefix([1, 2, 3, 4], [1, 2, 5]) == 2 and common_prefix([], [1]) == 0


def test_the_native_cache_grows_when_a_prompt_outgrows_it(tiny_v32):
    session = Session(tiny_v32)
    params = SamplingParams(temperature=0.0)
    a = session.generate(list(range(200)), max_new_tokens=4, sampling=params, stop_ids=[])
    size = session.cache.max_len
    longer = list(range(200)) + a.tokens + list(range(600))
    b = session.generate(longer, max_new_tokens=4, sampling=params, stop_ids=[])
    assert session.cache.max_len > size and b.reused == 203
    assert (
        b.tokens == Session(tiny_v32).generate(longer, max_new_tokens=4, sampling=params, stop_ids=[]).tokens
    )


def test_smollm2_uses_its_own_template_with_tools_in_the_system_prompt(smollm2):
    model, tokenizer = smollm2.model, smollm2.tokenizer
    backend = LocalBackend(model, tokenizer, temperature=0.0, max_tokens=80)
    fmt = backend.format
    assert fmt.name == "template" and not fmt.renders_tools and not fmt.renders_calls
    deltas = []
    agent = Agent(backend, [add], system="You add numbers.", on_event=lambda k, p: deltas.append((k, p)))
    puppet = Puppet(model, tokenizer)
    call_text = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    first = puppet.say(call_text + "<|im_end|>")
    puppet.say("The answer is 5.<|im_end|>")
    prompts, prefilled = [], []
    original = backend.complete

    def recording(messages, tools_, **kw):
        before = backend.session.prefilled_tokens
        out = original(messages, tools_, **kw)
        prompts.append(backend.last_prompt_ids)
        prefilled.append(backend.session.prefilled_tokens - before)
        return out

    backend.complete = recording
    traj = agent.run("What is 2 + 3?")
    puppet.remove()
    assert traj.final == "The answer is 5." and traj.stop_reason == "answer"
    assert traj.messages[2]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 2, "b": 3}'}
    assert traj.messages[3]["content"] == "5"
    # the second prompt, written out by hand with SmolLM2's template conventions
    system = (
        "You add numbers.\n\n"
        + backend.format.template_messages(traj.messages[:2], agent.toolbox.schemas, True)[0][
            "content"
        ].split("\n\n", 1)[1]
    )
    expected = (
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
        f"<|im_start|>assistant\n{call_text}<|im_end|>\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"
    )
    assert system.startswith("You add numbers.\n\n# Tools") and '"name": "add"' in system
    assert backend.last_prompt == expected
    cached = len(prompts[0]) + len(first) - 1
    assert prompts[1][:cached] == prompts[0] + first[:-1]
    assert prefilled == [len(prompts[0]), len(prompts[1]) - cached]
    # streamed: nothing of the tool-call block, then the answer as content
    cut = next(i for i, (k, _) in enumerate(deltas) if k == "tool_result")
    streamed = [(p["kind"], p["text"]) for k, p in deltas if k == "delta"]
    assert all(kind == "content" and "<tool_call>" not in text for kind, text in streamed)
    assert "".join(p["text"] for k, p in deltas[cut:] if k == "delta") == "The answer is 5."


def test_smollm2_generates_freely(smollm2):
    backend = LocalBackend(smollm2.model, smollm2.tokenizer, temperature=0.0, max_tokens=12)
    traj = Agent(backend, [], thinking=False).run("Say hello.")
    assert traj.steps[0].prompt_tokens == len(backend.last_prompt_ids) > 0
    # 12 tokens cut its greeting: the text is kept, but it is not an answer
    assert traj.steps[0].finish_reason == "length" and traj.steps[0].completion_tokens == 12
    assert traj.stop_reason == "length" and traj.final is None and traj.messages[-1]["content"]


def test_a_tokenizer_without_v32_tokens_or_template_is_rejected(tiny_v32):
    tiny = load_model("tiny-native", device="cpu")
    with pytest.raises(AgentError, match="no chat template"):
        LocalBackend(tiny.model, tiny.tokenizer)
    with pytest.raises(AgentError, match=r"lacks the V3\.2 special tokens"):
        LocalBackend(tiny.model, tiny.tokenizer, format="v32")


def test_replies_are_capped_to_the_room_left_in_the_models_window(tiny_v32, v32_tokenizer):
    messages = [{"role": "user", "content": "Count to one hundred, please."}]
    n = LocalBackend(tiny_v32, v32_tokenizer).count_tokens(messages, [], thinking=False)

    def backend(window: int) -> LocalBackend:
        torch.manual_seed(0)
        eos = v32_tokenizer.convert_tokens_to_ids("<｜end▁of▁sentence｜>")
        config = tiny_native_config(
            vocab_size=len(v32_tokenizer), eos_token_id=eos, pad_token_id=eos, max_position_embeddings=window
        )
        return LocalBackend(DeepseekV32(config), v32_tokenizer, temperature=0.0, max_tokens=50)

    roomy = backend(n + 3)
    assert roomy.window == n + 3
    Puppet(roomy.model, v32_tokenizer).say("one two three four five six seven eight nine ten")
    out = roomy.complete(messages, [], thinking=False)
    assert out.usage.prompt_tokens == n and out.usage.completion_tokens == 3 and out.finish_reason == "length"
    full = backend(n)
    with pytest.raises(BackendError, match=rf"fills the model's {n}-token window"):
        full.complete(messages, [], thinking=False)
    traj = Agent(full, [], thinking=False).run(messages[0]["content"])
    assert traj.stop_reason == "context" and "window" in traj.error  # a full window, not a failure


def test_threads_of_parallel_fewest_step_sample_differently_and_a_run_repeats(tiny_v32, v32_tokenizer):
    def run(**seeds) -> list[str]:
        replies = []

        class Recording(LocalBackend):
            def complete(self, *args, **kwargs):
                out = super().complete(*args, **kwargs)
                replies.append(out.message.get("content", ""))
                return out

        backend = Recording(
            tiny_v32, v32_tokenizer, temperature=1.0, max_new_tokens=6, seed=seeds.get("backend")
        )
        sampling = {"seed": seeds["call"]} if "call" in seeds else None
        options = dict(context="parallel_fewest_step", parallel=3, max_steps=1, sampling=sampling)
        Agent(backend, [], thinking=False, **options).run("Say something.")
        return replies

    for seeds in ({"backend": 0}, {"call": 5}):  # the backend's seed, or one in the agent's sampling
        first = run(**seeds)
        assert len(first) == 3 and len(set(first)) == 3, first  # three threads, three different replies
        assert run(**seeds) == first  # the same seed, the same run


def test_smollm2_is_told_when_its_tool_call_cannot_be_read(smollm2):
    """The template format's parser reads only ``<tool_call>`` blocks: its problems are calls the
    model meant to make, so the loop answers them with an error instead of taking the text as final."""
    model, tokenizer = smollm2.model, smollm2.tokenizer
    backend = LocalBackend(model, tokenizer, temperature=0.0, max_tokens=40)
    puppet = Puppet(model, tokenizer)
    puppet.say('<tool_call>\n{"name": "add", "arguments": {"a": 2,}}\n</tool_call><|im_end|>')
    puppet.say("It is 5.<|im_end|>")
    traj = Agent(backend, [add], thinking=False).run("What is 2 + 3?")
    puppet.remove()
    assert traj.steps[0].problems[0]["part"] == "tool_calls" and traj.steps[0].tool_calls == []
    assert traj.messages[2] == {"role": "user", "content": traj.steps[0].call_error}
    assert "a JSON object in <tool_call>" in traj.steps[0].call_error
    assert traj.steps[0].call_error in backend.last_prompt  # rendered by SmolLM2's own template
    assert (traj.stop_reason, traj.final) == ("answer", "It is 5.")
