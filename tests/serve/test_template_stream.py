"""A chat-template model's reply streamed in any split of its text reassembles to the local agent's
parse of the whole text (``TemplateFormat.parse``): reasoning, content and tool calls of each
tool-call format, calls sent as soon as they close where the format closes them."""

from __future__ import annotations

import json
import random

import pytest

from dsv32.agent.backends.formats import TemplateFormat
from dsv32.agent.backends.toolparsers import tool_parser
from dsv32.serve.stream import reassemble
from dsv32.serve.template_stream import TemplateStream


class Format:
    """The parsing half of a TemplateFormat (no tokenizer needed)."""

    parse = TemplateFormat.parse

    def __init__(self, parser: str) -> None:
        self.tool_parser = tool_parser(parser)


def _call(name: str, **arguments) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


REPLIES = [
    ("hermes", False, 'Let me look.  \n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
     '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"city": "Paris", "hours": 24}}\n</tool_call>'),
    ("hermes", False, "<think>\nCheck the weather.\n</think>\n\nIt is sunny."),
    ("hermes", True, "Thinking without an opening tag.</think>The answer."),
    ("hermes", False, 'Cut <tool_call>\n{"name": "get_weather", "argu'),
    ("hermes", False, "  Plain text, no calls; a < and a <tool and a </think> here."),
    ("llama3_json", False, '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    ("llama3_json", False, "A set {1, 2} in words."),
    ("mistral", False, 'Checking.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
]  # fmt: skip


@pytest.mark.parametrize(("parser", "thinking", "text"), REPLIES)
def test_any_split_reassembles_to_the_parse_of_the_whole(parser, thinking, text):
    fmt = Format(parser)
    whole, _ = fmt.parse(text, thinking)
    rng = random.Random(0)
    for trial in range(30):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, trial % 12)))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        stream = TemplateStream(fmt, thinking)
        deltas = [stream.feed(p) for p in pieces] + [stream.finish()]
        got = reassemble(deltas)
        assert got["content"] == whole["content"]
        assert got["reasoning_content"] == whole.get("reasoning_content", "")
        calls = [{"type": c["type"], "function": c["function"]} for c in got["tool_calls"]]
        assert calls == whole.get("tool_calls", [])
        assert stream.message()["tool_calls"] == [{**c, "id": c["id"]} for c in got["tool_calls"]]


def test_content_streams_as_it_comes_and_a_hermes_call_as_soon_as_it_closes():
    stream = TemplateStream(Format("hermes"), False)
    assert stream.feed("Let me ").content == "Let me"
    assert stream.feed("look. <tool").content == " look."
    assert not stream.feed('_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n')
    delta = stream.feed("</tool_call>")
    assert delta.tool_calls[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert "".join(d["function"]["arguments"] for d in delta.tool_calls[1:]) == '{"city": "Paris"}'
    assert not stream.finish()
    assert stream.message()["tool_calls"][0]["function"]["name"] == "get_weather"
    thinking = TemplateStream(Format("hermes"), False)
    assert not thinking.feed("<thi") and thinking.feed("nk>Hmm, ").reasoning == "Hmm,"
    delta = thinking.feed("well.</think>\n\nYes")
    assert (delta.reasoning, delta.content) == (" well.", "Yes")
