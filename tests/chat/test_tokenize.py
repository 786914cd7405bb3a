"""Token ids, loss masks and the Jinja chat template on a real tokenizer (SmolLM2's, from GGUF)."""

from __future__ import annotations

import copy

import pytest

from dsv32.chat import (
    SPECIAL_TOKENS,
    TokenizerError,
    add_v32_special_tokens,
    chat_template,
    encode_messages,
    messages_for_template,
    missing_special_tokens,
    render_segments,
    tokenize_conversation,
)

EOS = "<｜end▁of▁sentence｜>"


@pytest.fixture
def tokenizer(smollm2_tokenizer):
    add_v32_special_tokens(smollm2_tokenizer)
    return smollm2_tokenizer


def runs(ids: list[int], mask: list[int]) -> list[list[int]]:
    """The maximal stretches of ids with mask 1."""
    out: list[list[int]] = []
    for i, (token, m) in enumerate(zip(ids, mask)):
        if m:
            if i == 0 or not mask[i - 1]:
                out.append([])
            out[-1].append(token)
    return out


def test_adding_special_tokens_is_explicit(smollm2_tokenizer):
    size = len(smollm2_tokenizer)
    assert missing_special_tokens(smollm2_tokenizer) == list(SPECIAL_TOKENS)
    with pytest.raises(TokenizerError, match="add_v32_special_tokens"):
        tokenize_conversation(smollm2_tokenizer, [{"role": "user", "content": "hi"}])
    with pytest.raises(TokenizerError, match="expected a Hugging Face tokenizer"):
        tokenize_conversation(None, [{"role": "user", "content": "hi"}])
    added = add_v32_special_tokens(smollm2_tokenizer)
    assert added == [*SPECIAL_TOKENS, "｜DSML｜"]
    assert len(smollm2_tokenizer) == size + len(added)  # the caller resizes embeddings to this
    assert add_v32_special_tokens(smollm2_tokenizer) == []
    for token in added:
        assert len(smollm2_tokenizer.encode("x" + token + "x", add_special_tokens=False)) == 3


def test_ids_equal_tokenizing_the_whole_prompt(tokenizer, fixture_messages, fixture_output):
    ids, mask = tokenize_conversation(tokenizer, fixture_messages)
    assert ids == tokenizer.encode(fixture_output, add_special_tokens=False)
    assert len(mask) == len(ids) and set(mask) == {0, 1}
    assert tokenizer.decode(ids, skip_special_tokens=False) == fixture_output


def test_mask_covers_exactly_the_assistant_turns(tokenizer, fixture_messages):
    ids, mask = tokenize_conversation(tokenizer, fixture_messages)
    assistant_texts = [s.text for s in render_segments(fixture_messages) if s.generated]
    decoded = [tokenizer.decode(run, skip_special_tokens=False) for run in runs(ids, mask)]
    assert decoded == assistant_texts
    eos = tokenizer.convert_tokens_to_ids(EOS)
    assert all(m == 1 for t, m in zip(ids, mask) if t == eos)  # every end token is trained
    # Reasoning of the last round and its </think> are trained; tool results and prompts are not.
    assert "获取到后天的天气数据，整理回复给用户📝</think>" in decoded[-1]
    prompt_text = tokenizer.decode([t for t, m in zip(ids, mask) if not m], skip_special_tokens=False)
    assert "<function_results>" in prompt_text and "temperature_high" in prompt_text
    assert "<function_results>" not in "".join(decoded) and "<｜User｜>" not in "".join(decoded)
    assert mask[0] == 0  # BOS


def test_train_on_last_round(tokenizer, fixture_messages):
    ids, mask = tokenize_conversation(tokenizer, fixture_messages, train_on="last_round")
    decoded = [tokenizer.decode(run, skip_special_tokens=False) for run in runs(ids, mask)]
    assert len(decoded) == 2 and all(text.endswith(EOS) for text in decoded)
    assert decoded[0].startswith("用户现在问后天的天气")
    with pytest.raises(ValueError, match="train_on"):
        tokenize_conversation(tokenizer, fixture_messages, train_on="some")


def test_chat_mode_does_not_train_the_think_markers(tokenizer, fixture_messages):
    ids, mask = tokenize_conversation(tokenizer, fixture_messages, "chat")
    decoded = [tokenizer.decode(run, skip_special_tokens=False) for run in runs(ids, mask)]
    assert not any("think>" in text for text in decoded)
    assert ids == tokenizer.encode(encode_messages(fixture_messages, "chat"), add_special_tokens=False)


def test_transformers_apply_chat_template(tokenizer, fixture_input, fixture_messages, fixture_output):
    template = chat_template()
    messages = messages_for_template(fixture_input["messages"])
    rendered = tokenizer.apply_chat_template(
        messages, tools=fixture_input["tools"], chat_template=template, tokenize=False
    )
    assert rendered == fixture_output
    chat = tokenizer.apply_chat_template(
        messages, tools=fixture_input["tools"], chat_template=template, tokenize=False, enable_thinking=False
    )
    assert chat == encode_messages(fixture_messages, "chat")
    # {% generation %} marks the same tokens as our loss mask.
    out = tokenizer.apply_chat_template(
        messages,
        tools=fixture_input["tools"],
        chat_template=template,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    ids, mask = tokenize_conversation(tokenizer, fixture_messages)
    assert list(out["input_ids"]) == ids
    assert list(out["assistant_masks"]) == mask


def test_template_rejects_what_encode_rejects(tokenizer, fixture_input):
    from jinja2.exceptions import TemplateError

    bad = copy.deepcopy(fixture_input["messages"][:3])
    bad.append({"role": "user", "content": "the tool call got no result"})
    with pytest.raises(TemplateError, match="message 3"):
        tokenizer.apply_chat_template(
            messages_for_template(bad), chat_template=chat_template(), tokenize=False
        )
    with pytest.raises(TemplateError, match="arguments must be a dict"):
        tokenizer.apply_chat_template(
            fixture_input["messages"], chat_template=chat_template(), tokenize=False
        )


def _call(name, **arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


CONVERSATIONS = [
    [{"role": "user", "content": "1+1=?"}],
    [
        {"role": "system", "content": "S", "response_format": {"type": "json_object"}},
        {"role": "developer", "content": "D", "tools": [{"type": "function", "function": {"name": "f"}}]},
        {"role": "assistant", "reasoning_content": "r", "tool_calls": [_call("f", a=1, b="x"), _call("f")]},
        {"role": "tool", "content": "one"},
        {"role": "tool", "content": "two"},
        {"role": "assistant", "reasoning_content": "r2", "content": "done"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "reasoning_content": "r3", "tool_calls": [_call("f", l=[1, {"k": None}])]},
    ],
    [
        {"role": "user", "content": "q"},
        {"role": "assistant", "tool_calls": [_call("g", x=True), _call("g", x=False)]},
        {"role": "tool", "content": "pending: the second result has not arrived"},
    ],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("thinking", [True, False])
def test_apply_chat_template_equals_encode_messages(smollm2_tokenizer, messages, thinking):
    rendered = smollm2_tokenizer.apply_chat_template(
        messages, chat_template=chat_template(), tokenize=False, thinking=thinking
    )
    assert rendered == encode_messages(messages, "thinking" if thinking else "chat")
