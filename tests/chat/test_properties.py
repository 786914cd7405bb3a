"""Property-based tests over generated conversations: encode -> parse, incremental encoding (``context=``
and :class:`IncrementalEncoder` over a changing conversation), the Jinja template, and fuzzing the
parser with truncated and mutated completions."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsv32.chat import (
    ConversationError,
    IncrementalEncoder,
    ParseError,
    chat_template,
    encode_messages,
    messages_for_template,
    parse_completion,
    render_segments,
)

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


# --- incremental encoding of a changing conversation ----------------------------------------------


def outcome(encode) -> tuple[str, object]:
    try:
        return "ok", encode()
    except ConversationError as err:
        return "error", str(err)


def segment_rows(segments) -> list[tuple]:
    return [(s.index, s.role, s.text) for s in segments]


def edited(message: dict, data) -> dict:
    """A copy of ``message`` with one of its texts changed (or its reasoning dropped)."""
    copy = dict(message)
    key = data.draw(st.sampled_from(["content", "reasoning_content"]), label="key")
    if key == "reasoning_content" and message["role"] != "assistant":
        key = "content"
    if key == "reasoning_content" and data.draw(st.booleans(), label="drop"):
        copy.pop(key, None)
    else:
        copy[key] = (copy.get(key) or "") + data.draw(RICH_TEXT, label="more")
    return copy


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(), MODES, st.data())
def test_an_incremental_encoder_renders_every_state_like_encode_messages(messages, mode, data):
    """A rollout's states, one after another: the conversation grows (new user turns included), is cut
    back, has an earlier message replaced or changed in place, loses or gains a message; every state
    encodes as encode_messages encodes it from scratch (or fails with the same error), and the leading
    segments reported as reused are the previous state's."""
    encoder = IncrementalEncoder(mode)
    state: list = []
    previous: list[tuple] = []
    cursor = 0  # the next message of `messages` to append
    for _ in range(data.draw(st.integers(1, 12), label="steps")):
        op = data.draw(
            st.sampled_from(["grow", "grow", "grow", "cut", "replace", "mutate", "remove", "user"])
        )
        if op == "grow" or not state:
            to = data.draw(st.integers(cursor, len(messages)), label="to")
            state, cursor = state + messages[cursor:to], to
        elif op == "cut":
            state = state[: data.draw(st.integers(0, len(state)), label="to")]
            cursor = min(cursor, len(state))
        elif op == "replace":
            at = data.draw(st.integers(0, len(state) - 1), label="at")
            state = [*state[:at], edited(state[at], data), *state[at + 1 :]]
        elif op == "mutate":  # in place: the encoder must not trust the object it saw before
            at = data.draw(st.integers(0, len(state) - 1), label="at")
            target = state[at]
            target.update(edited(target, data))
            if "reasoning_content" in target and data.draw(st.booleans(), label="pop"):
                del target["reasoning_content"]
        elif op == "remove":
            at = data.draw(st.integers(0, len(state) - 1), label="at")
            state = state[:at] + state[at + 1 :]
        else:
            at = data.draw(st.integers(0, len(state)), label="at")
            state = [
                *state[:at],
                {"role": "user", "content": data.draw(RICH_TEXT, label="text")},
                *state[at:],
            ]
        expected = outcome(lambda: segment_rows(render_segments(state, mode)))  # noqa: B023
        got = outcome(lambda: segment_rows(encoder.segments(state)))  # noqa: B023
        assert got == expected
        if expected[0] == "ok":
            rows, reused = expected[1], encoder.reused
            assert rows[:reused] == previous[:reused]
            assert encoder.encode(state) == encode_messages(state, mode)
            assert encoder.reused == len(rows)  # nothing changed since the call before
            previous = rows
