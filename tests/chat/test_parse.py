"""parse_completion: round trips, strict errors with positions, lenient recovery."""

from __future__ import annotations

import json

import pytest

from dsv32.chat import ParseError, encode_messages, parse_completion

EOS = "<｜end▁of▁sentence｜>"


def normalized(message: dict, thinking_mode: str = "thinking") -> dict:
    """What survives an encode/parse round trip: text fields as strings, arguments as JSON values."""
    return {
        "content": message.get("content") or "",
        "reasoning_content": (message.get("reasoning_content") or "") if thinking_mode == "thinking" else "",
        "tool_calls": [
            (
                tc["function"]["name"],
                json.loads(a) if isinstance(a := tc["function"]["arguments"], str) else a,
            )
            for tc in message.get("tool_calls") or []
        ],
    }


def dsml(*invokes: str) -> str:
    return "\n\n<｜DSML｜function_calls>\n" + "\n".join(invokes) + "\n</｜DSML｜function_calls>"


def invoke(name: str, *params: str) -> str:
    return f'<｜DSML｜invoke name="{name}">\n' + "\n".join(params) + "\n</｜DSML｜invoke>"


def param(key: str, value: str, string: str = "true") -> str:
    return f'<｜DSML｜parameter name="{key}" string="{string}">{value}</｜DSML｜parameter>'


def test_every_fixture_assistant_message_round_trips(fixture_messages):
    assistants = [i for i, m in enumerate(fixture_messages) if m["role"] == "assistant"]
    assert len(assistants) == 5
    for i in assistants:
        completion = encode_messages([fixture_messages[i]], context=fixture_messages[:i])
        parsed = parse_completion(completion, "thinking")
        assert set(parsed) == {"role", "content", "reasoning_content", "tool_calls"}
        assert parsed["role"] == "assistant"
        assert normalized(parsed) == normalized(fixture_messages[i])
        for got, sent in zip(parsed["tool_calls"], fixture_messages[i].get("tool_calls") or []):
            assert got == {
                "type": "function",
                "function": {k: sent["function"][k] for k in ("name", "arguments")},
            }


def test_chat_mode_round_trip(fixture_messages):
    for i, message in enumerate(fixture_messages):
        if message["role"] == "assistant":
            completion = encode_messages([message], "chat", context=fixture_messages[:i])
            parsed = parse_completion(completion, "chat")
            assert normalized(parsed, "chat") == normalized(message, "chat")
            assert parsed["reasoning_content"] == ""


def test_values_and_empty_invoke():
    text = "r</think>" + dsml(
        invoke("f", param("s", '{"not": "parsed"}'), param("n", "-1.5e3", "false"), param("o", '{"a": [null, true]}', "false")),
        invoke("g"),
    ) + EOS  # fmt: skip
    calls = parse_completion(text)["tool_calls"]
    assert json.loads(calls[0]["function"]["arguments"]) == {
        "s": '{"not": "parsed"}',
        "n": -1500.0,
        "o": {"a": [None, True]},
    }
    assert calls[1]["function"] == {"name": "g", "arguments": "{}"}


def error_of(text: str, mode: str = "thinking") -> ParseError:
    with pytest.raises(ParseError) as info:
        parse_completion(text, mode)
    assert isinstance(info.value, ValueError)
    return info.value


CALL = invoke("f", param("a", "x"))


@pytest.mark.parametrize(
    ("text", "position", "expected"),
    [
        ("r</think>answer", len("r</think>answer"), "the end token"),
        ("still thinking", len("still thinking"), "'</think>' closing the reasoning"),
        ("r" + EOS, 1, "'</think>' closing the reasoning"),
        ("r" + dsml(CALL) + EOS, 1, "'</think>' closing the reasoning"),
        ("r</think>a" + EOS + "more", len("r</think>a" + EOS), "nothing after the end token"),
        ("r</think>a<think>b" + EOS, len("r</think>a"), "content without the special marker '<think>'"),
        ("r<｜User｜></think>a" + EOS, 1, "reasoning without the special marker"),
        (
            "r</think>" + dsml(CALL) + "junk" + EOS,
            len("r</think>" + dsml(CALL)),
            "right after the tool calls",
        ),
    ],
)
def test_strict_errors_say_where_and_what(text, position, expected):
    error = error_of(text)
    assert error.position == position
    assert expected in error.expected
    assert f"at position {position}" in str(error)


def test_broken_dsml_is_located():
    head = 'r</think>\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="a" string="'
    error = error_of(
        head + 'maybe">x</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>' + EOS
    )
    assert (
        error.position == len(head)
        and "string attribute" in error.expected
        and error.found.startswith("maybe")
    )

    bad_json = "r</think>" + dsml(invoke("f", param("n", "{1: 2}", "false"))) + EOS
    error = error_of(bad_json)
    assert "JSON value for parameter 'n'" in error.expected
    assert bad_json[error.position :].startswith("{1: 2}")

    duplicate = "r</think>" + dsml(invoke("f", param("a", "1"), param("a", "2"))) + EOS
    assert "already given" in error_of(duplicate).expected

    unclosed = "r</think>" + dsml(invoke("f", param("a", "1"))).replace("</｜DSML｜invoke>", "") + EOS
    assert "</｜DSML｜invoke>" in error_of(unclosed).expected

    assert (
        "JSON value" in error_of("r</think>" + dsml(invoke("f", param("x", "1e400", "false"))) + EOS).expected
    )


def test_chat_mode_has_no_reasoning_section():
    assert parse_completion("hello" + EOS, "chat") == {
        "role": "assistant",
        "content": "hello",
        "reasoning_content": "",
        "tool_calls": [],
    }
    assert "special marker '</think>'" in error_of("r</think>hello" + EOS, "chat").expected


def test_non_text_and_bad_mode():
    with pytest.raises(ParseError):
        parse_completion(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="thinking_mode"):
        parse_completion("x", "reasoning")


# --- lenient mode ---------------------------------------------------------------------------------


def lenient(text: str, mode: str = "thinking") -> dict:
    return parse_completion(text, mode, strict=False)


def test_lenient_clean_completion_has_no_problems():
    text = "r</think>" + dsml(CALL) + EOS
    result = lenient(text)
    assert result["problems"] == []
    assert {k: v for k, v in result.items() if k != "problems"} == parse_completion(text)


def test_lenient_cut_during_reasoning():
    result = lenient("I am still thin")
    assert result["reasoning_content"] == "I am still thin" and result["content"] == ""
    assert [p["expected"].split(" ")[0] for p in result["problems"]] == ["'</think>'", "the"]
    assert "max tokens" in result["problems"][1]["expected"]


def test_lenient_missing_end_token_keeps_the_answer():
    result = lenient("r</think>the answer")
    assert (result["reasoning_content"], result["content"]) == ("r", "the answer")
    assert len(result["problems"]) == 1 and result["problems"][0]["position"] == len("r</think>the answer")


def test_lenient_keeps_complete_calls_before_a_broken_one():
    good = invoke("f", param("a", "1"))
    text = "r</think>" + dsml(good, invoke("g", param("b", "[1, 2", "false")))
    text = text[: text.index("[1, 2") + 3]  # cut at max tokens inside the second call
    result = lenient(text)
    assert [c["function"]["name"] for c in result["tool_calls"]] == ["f"]
    assert json.loads(result["tool_calls"][0]["function"]["arguments"]) == {"a": "1"}
    assert len(result["problems"]) == 2  # the unterminated parameter, then the missing end token


def test_lenient_tool_call_inside_thinking():
    # Cold-start style: the model calls a tool before closing its reasoning.
    result = lenient("let me check" + dsml(CALL) + EOS)
    assert result["reasoning_content"] == "let me check"
    assert [c["function"]["name"] for c in result["tool_calls"]] == ["f"]
    assert [p["position"] for p in result["problems"]] == [len("let me check")]


def test_lenient_keeps_bad_json_as_text():
    result = lenient("r</think>" + dsml(invoke("f", param("n", "oops", "false"))) + EOS)
    assert json.loads(result["tool_calls"][0]["function"]["arguments"]) == {"n": "oops"}
    assert "JSON value" in result["problems"][0]["expected"]
