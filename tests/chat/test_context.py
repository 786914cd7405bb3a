"""The thinking context rule (§3.2.1) as a function, and where the last user message is."""

from __future__ import annotations

import copy

from dsv32.chat import apply_thinking_context, encode_messages, last_user_index


def test_reasoning_before_the_last_user_message_is_dropped(fixture_messages):
    before = copy.deepcopy(fixture_messages)
    kept = apply_thinking_context(fixture_messages)
    assert fixture_messages == before  # pure
    assert last_user_index(fixture_messages) == 8
    for i, (old, new) in enumerate(zip(fixture_messages, kept)):
        if old["role"] == "assistant" and i < 8:
            assert "reasoning_content" not in new
            assert new.get("tool_calls") == old.get("tool_calls")  # tool calls are always kept
        else:
            assert new == old  # later reasoning, tool results, user and system messages unchanged


def test_reasoning_is_kept_across_any_number_of_tool_rounds():
    messages = [{"role": "user", "content": "q"}]
    for step in range(6):
        call = {"type": "function", "function": {"name": "f", "arguments": "{}"}}
        messages += [
            {"role": "assistant", "reasoning_content": f"r{step}", "tool_calls": [call]},
            {"role": "tool", "content": f"t{step}"},
        ]
    kept = apply_thinking_context(messages)
    assert [m["reasoning_content"] for m in kept if m["role"] == "assistant"] == [f"r{s}" for s in range(6)]
    prompt = encode_messages(messages)
    assert all(f"r{s}</think>" in prompt for s in range(6))
    # A new user message ends the round: all that reasoning leaves the prompt, the calls stay.
    later = encode_messages([*messages, {"role": "user", "content": "next"}])
    assert not any(f"r{s}" in later for s in range(6)) and later.count("<result>") == 6


def test_developer_messages_start_a_round_too():
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "reasoning_content": "r"},
        {"role": "developer", "content": "d"},
    ]
    assert last_user_index(messages) == 2
    assert "reasoning_content" not in apply_thinking_context(messages)[1]


def test_without_a_user_message_nothing_is_dropped():
    messages = [
        {"role": "system", "content": "s"},
        {"role": "assistant", "content": "a", "reasoning_content": "r"},
    ]
    assert last_user_index(messages) == -1
    assert apply_thinking_context(messages) == messages
