"""The streaming V3.2 parser: for every split of a completion into pieces, the deltas reassemble to
``parse_completion(text, strict=False)`` of the whole text, and a call is reported only once closed."""

from __future__ import annotations

import json
import random

import pytest

from dsv32.chat import EOS, parse_completion
from dsv32.chat.encode import render_tool_call
from dsv32.serve.stream import PlainStream, V32Stream, argument_fragments, reassemble, unstable_suffix

CALLS = (
    "\n\n<｜DSML｜function_calls>\n"
    + render_tool_call("get_weather", {"city": "Paris", "unit": "celsius"})
    + "\n"
    + render_tool_call("add", {"a": 1, "b": [2, {"c": None}], "note": 'say "hi"\n'})
    + "\n"
    + render_tool_call("noop", {})
    + "\n</｜DSML｜function_calls>"
)
COMPLETIONS = {
    "thinking": [
        "Let me check the weather.</think>I'll look it up." + CALLS + EOS,
        "Plan: add.</think>" + CALLS + EOS,
        "short</think>Hello\n\nworld, no calls." + EOS,
        "cut inside the reasoning </th",
        "no end token</think>answer text",
        "reasoning then calls without think end" + CALLS + EOS,
        "r</think>bad value" + CALLS.replace('string="false">1<', 'string="false">1x<') + EOS,
        "r</think>tail after the calls" + CALLS + "junk" + EOS + "more",
    ],
    "chat": [
        "Sure." + CALLS + EOS,
        "Plain answer with </think> and <｜DSML｜ marks." + EOS,
        "",
    ],
}
CUT_INSIDE_A_CALL = "Checking.</think>ok" + CALLS[: CALLS.index("</｜DSML｜invoke>", CALLS.index("add")) - 3]


def _clean(message: dict) -> dict:
    out = {k: message[k] for k in ("content", "reasoning_content")}
    out["tool_calls"] = [
        {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        for c in message["tool_calls"]
    ]
    return out


def _stream(pieces: list[str], mode: str) -> tuple[dict, V32Stream]:
    stream = V32Stream(mode)
    deltas = [stream.feed(p) for p in pieces] + [stream.finish()]
    message = reassemble(deltas)
    assert _clean(message) == _clean(stream.message())
    return message, stream


def _cases():
    for mode, texts in COMPLETIONS.items():
        for text in texts:
            yield mode, text
    yield "thinking", CUT_INSIDE_A_CALL


@pytest.mark.parametrize(("mode", "text"), list(_cases()))
def test_every_split_reassembles_to_the_whole_parse(mode, text):
    expected = _clean(parse_completion(text, mode, strict=False))
    splits = [[text[:i], text[i:]] for i in range(len(text) + 1)]
    splits.append(list(text))  # one character at a time
    rng = random.Random(0)
    for _ in range(20):
        cuts = sorted(rng.sample(range(len(text) + 1), min(6, len(text) + 1)))
        splits.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])])
    for pieces in splits:
        message, _ = _stream(pieces, mode)
        assert _clean(message) == expected, pieces


def test_a_whole_block_in_one_piece_gives_every_call_in_order():
    text = COMPLETIONS["thinking"][0]
    head = text.index("\n\n<｜DSML")
    stream = V32Stream("thinking")
    first = stream.feed(text[:head])
    block = stream.feed(text[head:])
    assert first.reasoning == "Let me check the weather." and first.content == "I'll look it up."
    headers = [tc for tc in block.tool_calls if "id" in tc]
    assert [h["index"] for h in headers] == [0, 1, 2]
    assert [h["function"]["name"] for h in headers] == ["get_weather", "add", "noop"]
    assert all(h["id"].startswith("call_") and h["function"]["arguments"] == "" for h in headers)
    # the header of a call comes before its argument fragments
    order = [(tc["index"], "id" in tc) for tc in block.tool_calls]
    assert order == sorted(order, key=lambda x: (x[0], not x[1]))
    args = json.loads(stream.message()["tool_calls"][1]["function"]["arguments"])
    assert args == {"a": 1, "b": [2, {"c": None}], "note": 'say "hi"\n'}


def test_a_call_is_reported_only_once_its_invoke_closes():
    stream = V32Stream("thinking")
    names = []
    for ch in COMPLETIONS["thinking"][1]:
        for tc in stream.feed(ch).tool_calls:
            if "id" in tc:
                names.append((tc["function"]["name"], stream.text.endswith("</｜DSML｜invoke>")))
    assert names == [("get_weather", True), ("add", True), ("noop", True)]


def test_the_text_is_parsed_again_only_when_a_marker_or_a_closed_invoke_arrives(monkeypatch):
    import dsv32.serve.stream as stream_module

    parses = []
    monkeypatch.setattr(
        stream_module,
        "parse_completion",
        lambda text, *a, **k: parses.append(len(text)) or parse_completion(text, *a, **k),
    )
    text = "long reasoning " * 200 + "</think>I'll look it up." + CALLS + EOS
    message, _ = _stream(list(text), "thinking")  # one character at a time: about 3,900 pieces
    assert _clean(message) == _clean(parse_completion(text, "thinking", strict=False))
    # </think>, the block opener, three closed invokes, the end token, finish
    assert len(parses) <= 8, parses


def test_a_completion_cut_inside_a_call_reports_only_the_complete_calls():
    message, _ = _stream([CUT_INSIDE_A_CALL], "thinking")
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]
    assert message["content"] == "ok"


def test_text_that_may_start_a_marker_is_held_back():
    stream = V32Stream("chat")
    assert stream.feed("Hello\n").content == "Hello"
    assert stream.feed("\n<｜DS").content == ""
    assert stream.feed("x").content == "\n\n<｜DSx"
    assert unstable_suffix("abc</thi") == len("</thi") and unstable_suffix("abc") == 0


def test_argument_fragments_concatenate_to_the_json():
    for arguments in ('{"a": 1, "b": "x"}', "{}", '{"k": [1, 2]}'):
        assert "".join(argument_fragments(arguments)) == arguments
    assert argument_fragments('{"a": 1, "b": "x"}') == ['{"a": 1', ', "b": "x"', "}"]


def test_plain_stream_is_all_content():
    stream = PlainStream()
    deltas = [stream.feed("a</think>"), stream.feed("b"), stream.finish()]
    assert reassemble(deltas)["content"] == "a</think>b" == stream.message()["content"]


@pytest.mark.parametrize("mode", ["thinking", "chat"])
def test_random_token_soups_stream_like_the_whole_parse(mode):
    """Completions glued from markers, pieces of markers and text, fed token by token."""
    pool = [
        "a",
        "b c",
        "\n",
        "\n\n",
        "</think>",
        "</th",
        EOS,
        "<｜end",
        "<｜DSML｜",
        '">\n',
        '" string="true">',
    ] + [CALLS[i : i + 17] for i in range(0, len(CALLS), 17)]
    rng = random.Random(1)
    for _ in range(300):
        tokens = [rng.choice(pool) for _ in range(rng.randint(0, 30))]
        if rng.random() < 0.3:
            tokens.insert(rng.randint(0, len(tokens)), CALLS)
        text = "".join(tokens)
        message, _ = _stream(tokens, mode)
        assert _clean(message) == _clean(parse_completion(text, mode, strict=False)), tokens
