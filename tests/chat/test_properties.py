"""Property-based tests over generated conversations: encode -> parse, incremental encoding, the
Jinja template, and fuzzing the parser with truncated and mutated completions."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsv32.chat import ParseError, chat_template, encode_messages, messages_for_template, parse_completion

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Text without protocol markers: every marker but <think>/</think> contains "｜"; those two are filtered.
ALPHABET = st.characters(codec="utf-8", exclude_characters="｜", exclude_categories=("Cs",))
TEXT = st.text(ALPHABET, max_size=12).filter(lambda s: "<think>" not in s and "</think>" not in s)
RICH_TEXT = st.one_of(TEXT, st.sampled_from(["", "\n\n", "<", '">\n', "{}", "a\n\nb", " 多云 ", '{"k": 1}']))
NAME = st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True)
KEY = st.text(ALPHABET, max_size=6).filter(lambda s: '"' not in s and "\n" not in s)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False, allow_infinity=False)
)
VALUES = st.recursive(
    SCALARS | RICH_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEY, inner, max_size=3),
    max_leaves=6,
)
TOOLS = [
    {
        "type": "function",
        "function": {"name": "search", "description": "Search", "parameters": {"type": "object"}},
    },
    {"type": "function", "function": {"name": "python", "description": "运行代码", "parameters": {}}},
]


@st.composite
def tool_calls(draw):
    return [
        {
            "id": f"call_{draw(st.integers(0, 10**6))}",
            "type": "function",
            "function": {
                "name": draw(NAME),
                "arguments": json.dumps(
                    draw(st.dictionaries(KEY, VALUES, max_size=4)), ensure_ascii=draw(st.booleans())
                ),
            },
        }
        for _ in range(draw(st.integers(1, 3)))
    ]


@st.composite
def assistant_messages(draw, with_calls=None):
    calls = draw(tool_calls()) if (draw(st.booleans()) if with_calls is None else with_calls) else None
    message = {"role": "assistant", "content": draw(st.none() | RICH_TEXT)}
    reasoning = draw(RICH_TEXT.filter(bool)) if calls is None else draw(st.none() | RICH_TEXT)
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return message


@st.composite
def conversations(draw):
    """System?, then 1-3 rounds: a user (or developer) turn, 0-2 tool rounds, maybe a final answer."""
    messages = []
    if draw(st.booleans()):
        system = {"role": "system", "content": draw(RICH_TEXT)}
        if draw(st.booleans()):
            system["tools"] = TOOLS
        if draw(st.booleans()):
            system["response_format"] = {"type": "json_object"}
        messages.append(system)
    rounds = draw(st.integers(1, 3))
    for r in range(rounds):
        if draw(st.integers(0, 4)) == 0:
            messages.append({"role": "developer", "content": draw(TEXT.filter(bool))})
        else:
            messages.append({"role": "user", "content": draw(RICH_TEXT)})
        for _ in range(draw(st.integers(0, 2))):
            assistant = draw(assistant_messages(with_calls=True))
            messages.append(assistant)
            for tc in assistant["tool_calls"]:
                messages.append({"role": "tool", "tool_call_id": tc["id"], "content": draw(RICH_TEXT)})
        if r < rounds - 1 or draw(st.booleans()):
            messages.append(draw(assistant_messages(with_calls=False)))
    return messages


def normalized(message: dict, mode: str) -> dict:
    return {
        "content": message.get("content") or "",
        "reasoning_content": (message.get("reasoning_content") or "") if mode == "thinking" else "",
        "tool_calls": [
            (tc["function"]["name"], json.loads(tc["function"]["arguments"]))
            for tc in message.get("tool_calls") or []
        ],
    }


MODES = st.sampled_from(["thinking", "chat"])


@SETTINGS
@given(conversations(), MODES)
def test_every_assistant_turn_parses_back(messages, mode):
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            completion = encode_messages([message], mode, context=messages[:i])
            assert normalized(parse_completion(completion, mode), mode) == normalized(message, mode)


@SETTINGS
@given(conversations(), MODES, st.data())
def test_incremental_encoding(messages, mode, data):
    full = encode_messages(messages, mode)
    k = data.draw(st.integers(1, len(messages)), label="split")
    context, new = messages[:k], messages[k:]
    tail = encode_messages(new, mode, context=context)
    assert full.endswith(tail)
    if mode == "chat" or all(m["role"] not in ("user", "developer") for m in new):
        assert encode_messages(context, mode) + tail == full


@SETTINGS
@given(conversations(), MODES)
def test_jinja_template_renders_like_encode_messages(messages, mode):
    render_jinja_template = pytest.importorskip(
        "transformers.utils.chat_template_utils"
    ).render_jinja_template
    rendered, _ = render_jinja_template(
        [messages_for_template(messages)], chat_template=chat_template(), thinking=mode == "thinking"
    )
    assert rendered[0] == encode_messages(messages, mode)


# --- fuzzing the parser ---------------------------------------------------------------------------

FRAGMENTS = st.sampled_from(
    ["</think>", "<think>", "<｜end▁of▁sentence｜>", "\n\n<｜DSML｜function_calls>\n", "</｜DSML｜function_calls>",
     '<｜DSML｜invoke name="', "</｜DSML｜invoke>", '<｜DSML｜parameter name="', "</｜DSML｜parameter>",
     'string="false">', 'string="true">', '">\n', "\n", '"', "{", "]", "1e400", "NaN", "｜", "<"]
)  # fmt: skip


@st.composite
def completions(draw):
    mode = draw(MODES)
    message = draw(assistant_messages())
    context = [{"role": "user", "content": "q"}]
    return mode, message, encode_messages([message], mode, context=context)


def check_lenient(text: str, mode: str) -> dict:
    result = parse_completion(text, mode, strict=False)
    assert result["role"] == "assistant"
    assert isinstance(result["content"], str) and isinstance(result["reasoning_content"], str)
    for call in result["tool_calls"]:
        assert call["type"] == "function" and isinstance(call["function"]["name"], str)
        assert isinstance(json.loads(call["function"]["arguments"]), dict)
    for problem in result["problems"]:
        assert 0 <= problem["position"] <= len(text) and problem["expected"]
    return result


@settings(max_examples=150, deadline=None)
@given(completions(), st.data())
def test_truncated_completions(case, data):
    mode, message, text = case
    cut = data.draw(st.integers(0, len(text) - 1), label="cut")
    truncated = text[:cut]
    with pytest.raises(ParseError):  # the end token is always the last thing; it is now missing
        parse_completion(truncated, mode)
    result = check_lenient(truncated, mode)
    assert result["problems"]
    original = normalized(message, mode)["tool_calls"]
    recovered = normalized(result, mode)["tool_calls"]
    assert recovered == original[: len(recovered)]  # complete calls only, never a half call


@settings(max_examples=200, deadline=None)
@given(completions(), st.data())
def test_mutated_completions_raise_only_parse_error(case, data):
    mode, _, text = case
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        at = data.draw(st.integers(0, len(text)), label="at")
        op = data.draw(st.sampled_from(["insert", "delete", "replace"]), label="op")
        if op == "insert":
            text = text[:at] + data.draw(FRAGMENTS | TEXT, label="fragment") + text[at:]
        elif op == "delete":
            text = text[:at] + text[at + data.draw(st.integers(1, 12), label="n") :]
        else:
            text = text[:at] + data.draw(ALPHABET, label="char") + text[at + 1 :]
    try:
        strict = parse_completion(text, mode)
    except ParseError as err:
        assert 0 <= err.position <= len(text)
    else:
        lenient = check_lenient(text, mode)
        assert lenient.pop("problems") == [] and lenient == strict
    check_lenient(text, mode)
