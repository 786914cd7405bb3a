"""The local backend's prompt formats on their own. The V3.2 format renders and tokenizes only what a
step adds, and its prompt is still the full rendering of the conversation, byte for byte and token for
token, whatever happens to the history (new user turns, discarded rounds, messages changed in place,
another mode or tool list). The template format renders the whole conversation but tokenizes only
what changed, in pieces cut at special tokens; the ids equal tokenizing the whole prompt, with
SmolLM2's byte-level BPE and with SentencePiece-style tokenizers (built here: BPE with a ``▁``
prefix normalizer as Llama 2's, Metaspace with ``prepend_scheme="first"``, Unigram)."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsv32.agent import Agent
from dsv32.agent.backends import formats
from dsv32.agent.backends.base import Completion, Usage
from dsv32.agent.backends.formats import PieceTokenizer, TemplateFormat, V32Format, split_markers
from dsv32.chat import EOS, USER, attach_tools, encode, encode_messages, strip_tool_results

TOOLS = [
    {"type": "function", "function": {"name": "fetch", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "run", "parameters": {"type": "object", "properties": {}}}},
]
#: Texts that tokenize differently when cut (words, spaces, digits) or hold special-token strings.
TEXT = st.one_of(
    st.text(st.sampled_from("ab 1\n.<>/"), max_size=12),
    st.sampled_from(["", " ", "word", "42", "</result>", f"x{EOS}y", f"{USER}hi", "<think>", "多云"]),
)


def expected_text(messages: list[dict], tools: list[dict], thinking: bool) -> str:
    return encode_messages(
        attach_tools(strip_tool_results(messages), tools), "thinking" if thinking else "chat"
    )


def tool_round(data, step: int) -> list[dict]:
    n = data.draw(st.integers(1, 2), label="calls")
    assistant = {
        "role": "assistant",
        "content": data.draw(TEXT, label="content"),
        "reasoning_content": data.draw(TEXT, label="reasoning"),
        "tool_calls": [
            {
                "id": f"c{step}_{k}",
                "type": "function",
                "function": {"name": "fetch", "arguments": json.dumps({"i": step, "q": data.draw(TEXT)})},
            }
            for k in range(n)
        ],
    }
    results = [
        {"role": "tool", "tool_call_id": f"c{step}_{k}", "content": data.draw(TEXT, label="result")}
        for k in range(data.draw(st.integers(0, n), label="answered"))
    ]
    return [assistant, *results]


def complete(messages: list[dict]) -> list[dict]:
    """``messages`` with every pending tool call answered (the loop adds all results of a step)."""
    out = list(messages)
    for index in range(len(out) - 1, -1, -1):
        if out[index]["role"] == "assistant":
            calls = out[index].get("tool_calls") or []
            answered = len(out) - index - 1
            out += [{"role": "tool", "content": "r"} for _ in calls[answered:]]
            return out
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_v32_prompts_equal_a_full_rendering_whatever_the_history_does(v32_tokenizer, data):
    fmt = V32Format(v32_tokenizer)
    messages: list[dict] = [{"role": "user", "content": data.draw(TEXT, label="task")}]
    if data.draw(st.booleans(), label="system"):
        messages.insert(0, {"role": "system", "content": data.draw(TEXT, label="system prompt")})
    tools, thinking = TOOLS[:1], True
    for step in range(data.draw(st.integers(1, 10), label="steps")):
        op = data.draw(
            st.sampled_from(["round", "round", "round", "user", "discard", "mutate", "mode", "tools"])
        )
        if op == "round":
            messages = complete(messages) + tool_round(data, step)
        elif op == "user":  # a new round: the reasoning before it is dropped (thinking mode)
            messages = [*complete(messages), {"role": "user", "content": data.draw(TEXT, label="user")}]
        elif op == "discard":  # a context reset: the oldest rounds leave, the rest are new copies
            first = next(i for i, m in enumerate(messages) if m["role"] == "user") + 1
            rounds = [i for i in range(first, len(messages)) if messages[i]["role"] == "assistant"]
            cut = rounds[len(rounds) // 2] if rounds else first
            messages = messages[:first] + [dict(m) for m in messages[cut:]]
        elif op == "mutate":  # an earlier message changed in place
            target = messages[data.draw(st.integers(0, len(messages) - 1), label="at")]
            target["content"] = (target.get("content") or "") + data.draw(TEXT, label="more")
        elif op == "mode":
            thinking = not thinking
        else:
            tools = TOOLS[: data.draw(st.integers(0, 2), label="tools")]
        for _ in range(2):  # count_tokens, then complete: the second call reuses the first
            prompt = fmt.prompt(messages, tools, thinking)
            text = expected_text(messages, tools, thinking)
            assert prompt.text == text
            assert prompt.ids == v32_tokenizer.encode(text, add_special_tokens=False)


def test_v32_sees_an_earlier_message_changed_in_place(v32_tokenizer):
    fmt = V32Format(v32_tokenizer)
    messages = [{"role": "user", "content": "task"}]
    fmt.prompt(messages, TOOLS, True)
    messages[0]["content"] = "another task"
    messages += tool_round_fixed(0)
    assert fmt.prompt(messages, TOOLS, True).text == expected_text(messages, TOOLS, True)


def tool_round_fixed(step: int) -> list[dict]:
    return [
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": f"step {step}",
            "tool_calls": [
                {"id": f"c{step}", "type": "function", "function": {"name": "fetch", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": f"c{step}", "content": f"page {step}"},
    ]


class FormatBackend:
    """The local backend's prompt work (count_tokens, then complete) without a model: each reply calls
    ``fetch`` until ``steps`` replies were made."""

    def __init__(self, fmt, steps: int) -> None:
        self.fmt, self.steps, self.made = fmt, steps, 0

    def count_tokens(self, messages, tools, *, thinking=True) -> int:
        return len(self.fmt.prompt(messages, tools, thinking).ids)

    def complete(self, messages, tools, *, thinking=True, sampling=None, on_delta=None) -> Completion:
        prompt = self.fmt.prompt(messages, tools, thinking)
        self.made += 1
        message = {"role": "assistant", "content": "done", "reasoning_content": "enough"}
        if self.made < self.steps:
            call = {
                "type": "function",
                "function": {"name": "fetch", "arguments": json.dumps({"i": self.made})},
            }
            message = {"role": "assistant", "content": "", "reasoning_content": "more", "tool_calls": [call]}
        return Completion(
            message, Usage(len(prompt.ids), 1), "tool_calls" if self.made < self.steps else "stop"
        )


def fetch(i: int) -> str:
    """Fetch page i."""
    return f"page {i}: " + " ".join(f"word{j}" for j in range(50))


def test_v32_renders_and_tokenizes_each_message_once_per_episode(v32_tokenizer, monkeypatch):
    rendered, tokenized = [], []
    render = encode._render_assistant
    monkeypatch.setattr(
        encode, "_render_assistant", lambda index, *a: rendered.append(index) or render(index, *a)
    )
    fmt = V32Format(v32_tokenizer)
    tokenize = fmt._ids
    monkeypatch.setattr(fmt, "_ids", lambda text: tokenized.append(text) or tokenize(text))
    traj = Agent(FormatBackend(fmt, 40), [fetch]).run("Read the pages.")
    assert traj.stop_reason == "answer" and len(traj.steps) == 40
    # each reply is rendered once, in the prompt after it (at its index + 1: the system message with
    # the tools comes first); the last one is in no prompt
    assert rendered == [i + 1 for i, m in enumerate(traj.messages[:-1]) if m["role"] == "assistant"]
    assert "".join(tokenized) == fmt.last.text


# --- the template format ----------------------------------------------------------------------------

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "[INST] What is 2 + 3? [/INST] The answer is 5.",
    '<tool_call> {"name": "add", "arguments": {"a": 2, "b": 3}} </tool_call>',
    "<tool_response> page word1 word2 word3 </tool_response> <think> reasoning step </think>",
    "  spaces   and\nnewlines\n\n 多云 天气",
]
#: Llama 2's layout for every role (an instruction turn for all but the assistant's).
LLAMA_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'assistant' %}"
    "{{ ' ' + message['content'] + ' ' + eos_token }}"
    "{% else %}{{ bos_token + '[INST] ' + message['role'] + ': ' + message['content'] + ' [/INST]' }}"
    "{% endif %}{% endfor %}"
)


#: Llama 2's chat template: the system prompt folded into the first user turn, roles must alternate.
LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
    "{% set messages = messages[1:] %}{% else %}{% set system = false %}{% endif %}"
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system %}"
    "{% set content = '<<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}{% endif %}"
    "{% endfor %}"
)


def sentencepiece_tokenizer(kind: str):
    """A small SentencePiece-style fast tokenizer trained on CORPUS, with a chat template in Llama 2's
    layout."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    if kind == "unigram":
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
        trainer = trainers.UnigramTrainer(vocab_size=200, special_tokens=specials, unk_token="<unk>")
    else:
        tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
        if kind == "llama2":  # a "▁" before each section, spaces as "▁", no pre-tokenizer
            tokenizer.normalizer = normalizers.Sequence(
                [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
            )
        else:
            tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
        trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials)
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.train_from_iterator(CORPUS * 10, trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    wrapped.chat_template = LLAMA_TEMPLATE
    return wrapped


@pytest.fixture(scope="module", params=["smollm2", "llama2", "metaspace-first", "unigram"])
def any_tokenizer(request, smollm2_tokenizer):
    return smollm2_tokenizer if request.param == "smollm2" else sentencepiece_tokenizer(request.param)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_pieces_tokenize_like_the_whole_text(any_tokenizer, data):
    markers = split_markers(any_tokenizer)
    assert markers  # <|im_start|>, <|im_end|>, ... or <s>, </s>
    words = st.sampled_from(
        [*markers, " ", "  ", "\n", "a", "word", "x y", "42", "[INST] ", " [/INST]", "多云", "</", "s>"]
    )
    fragment = st.lists(words, min_size=1, max_size=6).map("".join)
    pieces, text = PieceTokenizer(any_tokenizer, markers), ""
    for _ in range(data.draw(st.integers(1, 15), label="steps")):
        at = (
            data.draw(st.integers(0, len(text)), label="at")
            if data.draw(st.booleans(), label="edit")
            else len(text)
        )
        cut = data.draw(st.integers(0, min(8, len(text) - at)), label="cut")
        text = text[:at] + data.draw(fragment, label="new") + text[at + cut :]
        assert pieces(text) == any_tokenizer.encode(text, add_special_tokens=False)
        assert pieces.tokenized <= len(text)


class Counting:
    """A tokenizer that counts the characters it is given to tokenize."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.chars = tokenizer, 0

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)

    def encode(self, text, **kw):
        self.chars += len(text)
        return self.tokenizer.encode(text, **kw)

    def __call__(self, texts, **kw):
        self.chars += sum(map(len, texts))
        return self.tokenizer(texts, **kw)


@pytest.mark.parametrize("name", ["smollm2", "llama2"])
def test_a_template_prompt_tokenizes_only_what_changed(name, smollm2_tokenizer):
    tokenizer = Counting(smollm2_tokenizer if name == "smollm2" else sentencepiece_tokenizer("llama2"))
    fmt = TemplateFormat(tokenizer, [tokenizer.eos_token_id])
    tokenizer.chars = 0
    backend = FormatBackend(fmt, 30)
    prompts = []
    original = backend.fmt.prompt

    def recording(messages, tools, thinking):
        prompt = original(messages, tools, thinking)
        prompts.append(prompt)
        return prompt

    backend.fmt.prompt = recording
    traj = Agent(backend, [fetch], thinking=False).run("Read the pages.")
    assert traj.stop_reason == "answer" and len(traj.steps) == 30
    for prompt in prompts:
        assert prompt.ids == tokenizer.tokenizer.encode(prompt.text, add_special_tokens=False)
    # every step tokenizes what it adds and the last piece of the prompt before it (the generation
    # prompt, or the last tool result when there is none), not the whole prompt
    assert tokenizer.chars < 3 * len(prompts[-1].text)


def test_the_same_template_conversation_is_rendered_once(smollm2_tokenizer, monkeypatch):
    fmt = TemplateFormat(smollm2_tokenizer, [smollm2_tokenizer.eos_token_id])
    renders = []
    render = fmt._render
    monkeypatch.setattr(fmt, "_render", lambda *a, **kw: renders.append(1) or render(*a, **kw))
    messages = [{"role": "user", "content": "task"}, *tool_round_fixed(0)]
    first = fmt.prompt(messages, TOOLS, False)
    assert fmt.prompt(messages, TOOLS, False) is first and len(renders) == 1  # count_tokens, then complete
    messages[2]["content"] = "page 0, changed in place"
    again = fmt.prompt(messages, TOOLS, False)
    assert len(renders) == 2 and "changed in place" in again.text
    assert again.ids == smollm2_tokenizer.encode(again.text, add_special_tokens=False)


def test_a_tokenizer_that_does_not_split_at_the_markers_is_given_whole_prompts(monkeypatch):
    tokenizer = sentencepiece_tokenizer("llama2")
    monkeypatch.setattr(formats, "split_markers", lambda tokenizer: [": ", "</s>"])  # ": " is no token
    fmt = TemplateFormat(tokenizer, [tokenizer.eos_token_id])
    assert fmt.markers == [] and fmt.pieces.pattern is None
    messages = [{"role": "user", "content": "task"}, *tool_round_fixed(0)]
    prompt = fmt.prompt(messages, TOOLS, False)
    assert prompt.ids == tokenizer.encode(prompt.text, add_special_tokens=False)


# --- reasoning in the template format (§3.2.1) ---------------------------------------------------------

PLAN = "SECRET-PLAN: look up X, then Y"


def round_with_reasoning() -> list[dict]:
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "X"}'}}
    return [
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": "Looking.", "reasoning_content": PLAN, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "result X"},
    ]


def test_a_template_that_ignores_reasoning_gets_the_kept_reasoning_in_the_content(smollm2_tokenizer):
    fmt = TemplateFormat(smollm2_tokenizer, [smollm2_tokenizer.eos_token_id])
    assert fmt.reasoning_field is None  # SmolLM2's template renders content only
    messages = round_with_reasoning()
    turn = (
        f"<|im_start|>assistant\n<think>\n{PLAN}\n</think>\n\nLooking.\n"
        '<tool_call>\n{"name": "lookup", "arguments": {"q": "X"}}\n</tool_call><|im_end|>\n'
    )
    assert turn in fmt.prompt(messages, [], True).text  # thinking: kept across the tool result
    assert PLAN not in fmt.prompt(messages, [], False).text  # chat mode: no reasoning
    later = [
        *messages,
        {"role": "assistant", "content": "X.", "reasoning_content": "r"},
        {"role": "user", "content": "next"},
    ]
    assert PLAN not in fmt.prompt(later, [], True).text  # a new user message: dropped
    # what is fed back reads back as the message the model produced
    content = turn.removeprefix("<|im_start|>assistant\n").removesuffix("<|im_end|>\n")
    message, problems = fmt.parse(content, True)
    assert problems == [] and message["reasoning_content"] == PLAN and message["content"] == "Looking."
    assert message["tool_calls"] == [
        {"type": "function", "function": messages[1]["tool_calls"][0]["function"]}
    ]


def test_a_template_that_renders_reasoning_gets_it_in_its_own_field(smollm2_tokenizer):
    tokenizer = copy.deepcopy(smollm2_tokenizer)
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['reasoning_content'] %}<reasoning>{{ m['reasoning_content'] }}</reasoning>{% endif %}"
        "{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    fmt = TemplateFormat(tokenizer, [tokenizer.eos_token_id])
    assert fmt.reasoning_field == "reasoning_content"
    text = fmt.prompt(round_with_reasoning(), [], True).text
    assert f"<reasoning>{PLAN}</reasoning>Looking.\n<tool_call>" in text and text.count(PLAN) == 1


# --- templates that refuse tool turns ------------------------------------------------------------------

#: A ChatML template that refuses any role but system, user and assistant.
NO_TOOL_ROLE = (
    "{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def two_calls(step: int) -> list[dict]:
    calls = [
        {
            "id": f"c{step}_{k}",
            "type": "function",
            "function": {"name": "fetch", "arguments": f'{{"i": {k}}}'},
        }
        for k in range(2)
    ]
    return [
        {"role": "assistant", "content": "", "tool_calls": calls},
        *({"role": "tool", "tool_call_id": c["id"], "content": f"page {c['id']}"} for c in calls),
    ]


def test_results_as_user_turns():
    messages = [{"role": "user", "content": "task"}, *two_calls(0), {"role": "user", "content": "more"}]
    assert formats.results_as_user(messages) == [
        messages[0],
        messages[1],
        {
            "role": "user",
            "content": "<tool_response>\npage c0_0\n</tool_response>\n<tool_response>\npage c0_1\n</tool_response>\nmore",
        },
    ]


def test_a_template_that_refuses_tool_turns_gets_the_results_as_user_turns(smollm2_tokenizer):
    tokenizer = copy.deepcopy(smollm2_tokenizer)
    tokenizer.chat_template = NO_TOOL_ROLE
    fmt = TemplateFormat(tokenizer, [tokenizer.eos_token_id])
    assert not fmt.tool_role and not fmt.renders_calls
    messages = [{"role": "user", "content": "task"}, *two_calls(0), *two_calls(1)]
    prompt = fmt.prompt(messages, TOOLS, False)
    results = "<tool_response>\npage c1_0\n</tool_response>\n<tool_response>\npage c1_1\n</tool_response>"
    assert prompt.text.endswith(f"<|im_start|>user\n{results}<|im_end|>\n<|im_start|>assistant\n")
    assert prompt.text.count("<|im_start|>user") == 3 and "<|im_start|>tool" not in prompt.text
    assert prompt.ids == tokenizer.encode(prompt.text, add_special_tokens=False)


def test_an_episode_runs_on_a_template_whose_roles_must_alternate():
    tokenizer = sentencepiece_tokenizer("llama2")
    tokenizer.chat_template = LLAMA2_TEMPLATE
    fmt = TemplateFormat(tokenizer, [tokenizer.eos_token_id])
    assert not fmt.tool_role
    traj = Agent(FormatBackend(fmt, 4), [fetch], system="Read carefully.").run("Read the pages.")
    assert traj.stop_reason == "answer" and len(traj.steps) == 4
    text = fmt.last.text
    assert (
        text.startswith("<s>[INST] <<SYS>>\nRead carefully.\n\n# Tools")
        and text.count("<tool_response>") == 3
    )
    assert fmt.last.ids == tokenizer.encode(text, add_special_tokens=False)
