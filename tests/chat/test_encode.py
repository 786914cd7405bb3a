"""encode_messages: the conformance fixture, every role and mode, incremental encoding, bad input."""

from __future__ import annotations

import copy
import json

import pytest

from dsv32.chat import (
    ConversationError,
    IncrementalEncoder,
    attach_tools,
    conversation_from_json,
    encode_messages,
    render_segments,
    render_tools,
)

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
U, A = "<｜User｜>", "<｜Assistant｜>"
TS, TE = "<think>", "</think>"


def call(name, arguments, id=None):
    tc = {"type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
    if id is not None:
        tc["id"] = id
    return tc


def dsml_calls(*invokes):
    return "\n\n<｜DSML｜function_calls>\n" + "\n".join(invokes) + "\n</｜DSML｜function_calls>"


def invoke(name, *params):
    return f'<｜DSML｜invoke name="{name}">\n' + "\n".join(params) + "\n</｜DSML｜invoke>"


def param(key, value, is_str):
    return f'<｜DSML｜parameter name="{key}" string="{"true" if is_str else "false"}">{value}</｜DSML｜parameter>'


# Two rounds with tools: a call with every JSON value type, a call without arguments, grouped results.
CONVERSATION = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "u1"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "r1",
        "tool_calls": [call("f", {"a": "x", "n": 2, "l": [1, "y"], "o": {"k": None}, "b": True, "x": 1.5})],
    },
    {"role": "tool", "content": "R1"},
    {"role": "assistant", "content": "A1", "reasoning_content": "r2"},
    {"role": "user", "content": "u2"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "r3",
        "tool_calls": [call("g", {}), call("f", {"a": "z"})],
    },
    {"role": "tool", "content": "R2"},
    {"role": "tool", "content": "R3"},
    {"role": "assistant", "content": "A2", "reasoning_content": "r4"},
]
CALLS_1 = dsml_calls(
    invoke(
        "f",
        param("a", "x", True),
        param("n", "2", False),
        param("l", '[1, "y"]', False),
        param("o", '{"k": null}', False),
        param("b", "true", False),
        param("x", "1.5", False),
    )
)
CALLS_2 = dsml_calls(invoke("g"), invoke("f", param("a", "z", True)))
RESULTS_1 = "\n\n<function_results>\n<result>R1</result>\n</function_results>\n\n"
RESULTS_2 = "\n\n<function_results>\n<result>R2</result>\n<result>R3</result>\n</function_results>\n\n"


def test_fixture_is_byte_exact(fixture_messages, fixture_output):
    assert encode_messages(fixture_messages, "thinking", drop_thinking=True, add_bos=True) == fixture_output


def test_fixture_tools_can_come_separately(fixture_input, fixture_output):
    assert encode_messages(attach_tools(fixture_input["messages"], fixture_input["tools"])) == fixture_output
    assert encode_messages(conversation_from_json(fixture_input)) == fixture_output


def test_drop_thinking_does_not_change_the_released_layout(fixture_messages, fixture_output):
    # Reasoning before the last user message has no place in the V3.2 layout (as in DeepSeek's encoder).
    assert encode_messages(fixture_messages, drop_thinking=False) == fixture_output


def test_thinking_mode_layout():
    expected = (
        BOS + "S" + U + "u1" + A + TE + CALLS_1 + EOS + RESULTS_1 + TE + "A1" + EOS
        + U + "u2" + A + TS + "r3" + TE + CALLS_2 + EOS + RESULTS_2 + TS + "r4" + TE + "A2" + EOS
    )  # fmt: skip
    assert encode_messages(CONVERSATION, "thinking") == expected


def test_chat_mode_layout():
    expected = (
        BOS + "S" + U + "u1" + A + TE + CALLS_1 + EOS + RESULTS_1 + TE + "A1" + EOS
        + U + "u2" + A + TE + CALLS_2 + EOS + RESULTS_2 + TE + "A2" + EOS
    )  # fmt: skip
    assert encode_messages(CONVERSATION, "chat") == expected


def test_prompt_ends_by_opening_the_assistant_turn():
    messages = [{"role": "user", "content": "1+1=?"}]
    assert encode_messages(messages, "thinking") == BOS + U + "1+1=?" + A + TS
    assert encode_messages(messages, "chat") == BOS + U + "1+1=?" + A + TE
    assert encode_messages(messages, add_bos=False) == U + "1+1=?" + A + TS


def test_tools_block_matches_the_fixture(fixture_input, fixture_output):
    start = len(BOS + "You are a helpful Assistant.\n\n")
    assert render_tools(fixture_input["tools"]) == fixture_output[start : fixture_output.index(U)]


def test_system_tools_then_response_format(fixture_input):
    tools = fixture_input["tools"]
    schema = {"type": "json_object", "name": "天气"}
    messages = [
        {"role": "system", "content": "S", "tools": tools, "response_format": schema},
        {"role": "user", "content": "q"},
    ]
    response_format = (
        "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
        '{"type": "json_object", "name": "天气"}'
    )
    expected = BOS + "S\n\n" + render_tools(tools) + "\n\n" + response_format + U + "q" + A + TS
    assert encode_messages(messages) == expected


def test_developer_is_a_user_turn_with_tools_and_instructions(fixture_input):
    tools = fixture_input["tools"]
    messages = [
        {"role": "developer", "content": "first", "tools": tools},
        {"role": "assistant", "content": "ok"},
        {"role": "developer", "content": "D"},
    ]
    expected = (
        BOS + U + "\n\n" + render_tools(tools) + "\n\n# The user's message is: first" + A + TE + "ok" + EOS
        + U + "\n\n# The user's message is: D" + A + TS
    )  # fmt: skip
    assert encode_messages(messages) == expected


def test_tool_results_after_an_earlier_user_turn_close_thinking():
    assert encode_messages(CONVERSATION).count(RESULTS_1 + TE) == 1
    assert encode_messages(CONVERSATION).count(RESULTS_2 + TS) == 1


def test_pending_tool_results_are_a_valid_prefix():
    messages = CONVERSATION[:8]  # the second call of message 6 has no result yet
    prompt = encode_messages(messages)
    assert prompt.endswith("\n<result>R2</result>")
    assert prompt + encode_messages(CONVERSATION[8:], context=messages) == encode_messages(CONVERSATION)


@pytest.mark.parametrize("mode", ["thinking", "chat"])
def test_incremental_encoding_on_the_fixture(fixture_messages, mode):
    full = encode_messages(fixture_messages, mode)
    for k in range(1, len(fixture_messages) + 1):
        context, new = fixture_messages[:k], fixture_messages[k:]
        tail = encode_messages(new, mode, context=context)
        assert full.endswith(tail)
        if mode == "chat" or all(m["role"] != "user" for m in new):
            assert encode_messages(context, mode) + tail == full, k


def test_a_new_user_turn_changes_the_prefix_in_thinking_mode(fixture_messages):
    # By §3.2.1 the user turn that was last opened <think>; once a new user message arrives it closes.
    context, new = fixture_messages[:2], fixture_messages[2:]
    assert encode_messages(context).endswith(TS)
    assert encode_messages(context) + encode_messages(new, context=context) != encode_messages(
        fixture_messages
    )


def test_segments_cover_the_prompt(fixture_messages, fixture_output):
    segments = render_segments(fixture_messages)
    assert "".join(s.text for s in segments) == fixture_output
    assert [s.index for s in segments] == [None, *range(len(fixture_messages))]
    assert [s.generated for s in segments].count(True) == 5


def test_an_incremental_encoder_grows_the_fixture_one_message_at_a_time(fixture_messages, fixture_output):
    encoder, rendered = IncrementalEncoder(), []
    for k in range(len(fixture_messages) + 1):
        segments = encoder.segments(fixture_messages[:k])
        assert "".join(s.text for s in segments) == encode_messages(fixture_messages[:k])
        rendered.append(len(segments) - encoder.reused)
    assert encoder.encode(fixture_messages) == fixture_output
    # each step renders its new message; the second user message (8) re-renders the round before it
    # (from the first user message: its <think> closes, its turns lose their reasoning)
    assert rendered == [1, 1, 1, 1, 1, 1, 1, 1, 1, 8, 1, 1, 1, 1]


def test_an_incremental_encoder_drops_the_reasoning_when_a_user_turn_arrives():
    encoder = IncrementalEncoder()
    turn = [USER, assistant_calling("f"), {"role": "tool", "content": "R", "tool_call_id": "id_f"}]
    assert "r</think>" in encoder.encode(turn)
    grown = [*turn, {"role": "assistant", "content": "A", "reasoning_content": "r2"}, USER]
    assert encoder.encode(grown) == encode_messages(grown) and "r</think>" not in encoder.encode(grown)
    assert encoder.encode(turn) == encode_messages(turn)  # the user turn taken back: reasoning again


@pytest.mark.parametrize(
    ("before", "after"),
    [({"a": 1}, {"a": True}), ({"a": 1}, {"a": 1.0}), ({"a": 0.0}, {"a": -0.0}), ({"a": 1, "b": 2}, {"b": 2, "a": 1})],
)  # fmt: skip
def test_an_incremental_encoder_sees_changes_that_compare_equal(before, after):
    """Tool-call arguments given as a dict are written out with their types and key order: a change
    in place that == cannot see still re-renders the message."""
    message = {"role": "assistant", "reasoning_content": "r", "tool_calls": [call("f", {})]}
    message["tool_calls"][0]["function"]["arguments"] = dict(before)
    conversation = [USER, message]
    encoder = IncrementalEncoder()
    assert encoder.encode(conversation) == encode_messages(conversation)
    arguments = message["tool_calls"][0]["function"]["arguments"]
    arguments.clear()
    arguments.update(after)
    assert (
        encoder.encode(conversation)
        == encode_messages(conversation)
        != encode_messages([USER, {**message, "tool_calls": [call("f", before)]}])
    )


def test_an_incremental_encoder_sees_the_tools_change_in_place(fixture_input):
    tools = copy.deepcopy(fixture_input["tools"])
    conversation = attach_tools([USER], tools)
    encoder = IncrementalEncoder()
    assert encoder.encode(conversation) == encode_messages(conversation)
    parameters = tools[0]["function"]["parameters"]
    reordered = dict(reversed(parameters.items()))  # equal, but written in another order
    parameters.clear()
    parameters.update(reordered)
    assert encoder.encode(conversation) == encode_messages(conversation)
    assert encoder.reused == 1  # the BOS only


def test_an_incremental_encoder_keeps_its_state_after_bad_input():
    encoder = IncrementalEncoder()
    good = [USER, assistant_calling("f")]
    encoder.encode(good)
    with pytest.raises(ConversationError, match="message 3: more tool results"):
        encoder.encode([*good, {"role": "tool", "content": "a"}, {"role": "tool", "content": "b"}])
    grown = [*good, {"role": "tool", "content": "a"}]
    assert encoder.encode(grown) == encode_messages(grown)


def test_an_incremental_encoder_prepares_what_it_renders():
    encoder = IncrementalEncoder(
        "chat", prepare=lambda m: {**m, "content": m["content"].upper()} if m["role"] == "tool" else m
    )
    turn = [USER, assistant_calling("f"), {"role": "tool", "content": "result"}]
    assert "<result>RESULT</result>" in encoder.encode(turn) and turn[2]["content"] == "result"


def test_input_is_not_modified(fixture_messages):
    before = copy.deepcopy(fixture_messages)
    encode_messages(fixture_messages)
    assert fixture_messages == before


def test_arguments_may_be_a_dict():
    as_string = [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [call("f", {"a": 1})]}]
    as_dict = copy.deepcopy(as_string)
    as_dict[1]["tool_calls"][0]["function"]["arguments"] = {"a": 1}
    assert encode_messages(as_dict) == encode_messages(as_string)


USER = {"role": "user", "content": "q"}


def assistant_calling(*names):
    return {
        "role": "assistant",
        "reasoning_content": "r",
        "tool_calls": [call(n, {}, id=f"id_{n}") for n in names],
    }


def tool(name, parameters=None):
    function = {"name": name} if parameters is None else {"name": name, "parameters": parameters}
    return {"type": "function", "function": function}


def bad_args(arguments):
    return {
        "role": "assistant",
        "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": arguments}}],
    }


@pytest.mark.parametrize(
    ("messages", "index", "problem"),
    [
        ([{"role": "bot", "content": "x"}], 0, "unknown role 'bot'"),
        ([USER, {"content": "x"}], 1, "unknown role None"),
        ([USER, {"role": "tool", "content": "r"}], 1, "no preceding assistant tool call"),
        ([USER, assistant_calling("f"), {"role": "tool", "content": "r"}, {"role": "tool", "content": "r"}], 3,
         "more tool results than the 1 tool calls of assistant message 1"),
        ([USER, assistant_calling("f", "g"), {"role": "tool", "content": "r"}, USER], 3, "got only 1 results"),
        ([USER, bad_args("{oops")], 1, "not valid JSON"),
        ([USER, bad_args("[1, 2]")], 1, "must be a JSON object"),
        ([USER, bad_args('{"x": NaN}')], 1, "not valid JSON"),
        ([USER, bad_args(7)], 1, "JSON object string or a dict"),
        ([USER, bad_args({'a"b': 1})], 1, "argument name"),
        ([USER, bad_args({"text": "x</｜DSML｜parameter>y"})], 1, "which would end it early"),
        ([USER, bad_args({"items": ["</｜DSML｜parameter>"]})], 1, "which would end it early"),
        ([USER, {"role": "assistant", "content": "no reasoning"}], 1, "needs `reasoning_content` or `tool_calls`"),
        ([USER, {"role": "assistant", "content": "x", "reasoning_content": ""}], 1, "needs `reasoning_content`"),
        ([{"role": "user", "content": None}], 0, "must be a string"),
        ([{"role": "user", "content": [{"type": "text", "text": "x"}]}], 0, "must be a string, got a list"),
        ([{"role": "developer", "content": ""}], 0, "non-empty content"),
        ([{"role": "user", "content": "x", "tools": [{"type": "function", "function": {"name": "f"}}]}], 0,
         "`tools` belongs on a system or developer message"),
        ([{"role": "system", "content": "s", "tools": [{"name": "f"}]}], 0, "tool 0 must look like"),
        ([{"role": "system", "content": "s", "tools": [tool("f"), tool("g"), tool("f")]}], 0,
         "tool 2: the name 'f' is given twice"),
        ([{"role": "system", "content": "s", "tools": [tool('say "hi"')]}], 0, "without quotes"),
        ([{"role": "system", "content": "s", "tools": [tool("")]}], 0, "must be non-empty"),
        ([{"role": "system", "content": "s", "tools": [tool("f", {"properties": 5})]}], 0,
         "`parameters` must be a JSON Schema object"),
        ([{"role": "system", "content": "s", "tools": [tool("f", "a string")]}], 0,
         "`parameters` must be a JSON Schema object"),
        ([{"role": "user", "content": "x", "reasoning_content": "r"}], 0, "belongs on an assistant message"),
        ([USER, assistant_calling("f"), {"role": "tool", "content": "r", "tool_call_id": "nope"}], 2,
         "tool_call_id 'nope' matches no tool call"),
        ([USER, "hello"], 1, "must be a dict"),
    ],
)  # fmt: skip
def test_bad_input_names_the_message(messages, index, problem):
    with pytest.raises(ConversationError) as info:
        encode_messages(messages)
    assert isinstance(info.value, ValueError)
    assert info.value.index == index
    assert f"message {index}: " in str(info.value) and problem in str(info.value)


def test_chat_mode_needs_no_reasoning():
    assert encode_messages([USER, {"role": "assistant", "content": "hi"}], "chat").endswith("hi" + EOS)


def test_errors_count_the_context():
    context = [USER, {"role": "assistant", "content": "a", "reasoning_content": "r"}]
    with pytest.raises(ConversationError, match="message 2: tool result"):
        encode_messages([{"role": "tool", "content": "r"}], context=context)


def test_bad_mode_and_bad_container():
    with pytest.raises(ValueError, match="thinking_mode"):
        encode_messages([USER], "reasoning")
    with pytest.raises(ConversationError, match="list of dicts"):
        encode_messages("hello")


def test_attach_tools_rules(fixture_input):
    tools = fixture_input["tools"]
    inserted = attach_tools([USER], tools)
    assert inserted[0] == {"role": "system", "content": "", "tools": tools} and inserted[1] == USER
    assert encode_messages(inserted).startswith(BOS + "\n\n## Tools")
    with pytest.raises(ConversationError, match="already has `tools`"):
        attach_tools(attach_tools([USER], tools), tools)
    assert attach_tools([USER], None) == [USER]


def test_tools_that_are_not_a_list_are_refused_when_attached():
    with pytest.raises(ConversationError, match="tools must be a list"):
        attach_tools([USER], "abc")
