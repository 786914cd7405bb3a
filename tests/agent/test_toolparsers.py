"""The tool-call formats of chat-template models (hermes, llama3_json, mistral): a call written the
way a family writes it reads back as the same call, content before it stays content, a broken call
is a problem in the tool-call block, and a template's family picks its format."""

from __future__ import annotations

import json

import pytest

from dsv32.agent import AgentError
from dsv32.agent.backends.toolparsers import PARSERS, detect_parser, tool_parser

CALL = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
OTHER = {"type": "function", "function": {"name": "get_time", "arguments": '{"city": "Rome", "hours": 24}'}}


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_a_rendered_call_reads_back_as_the_same_call(name):
    parser = tool_parser(name)
    content, calls, problems = parser.parse(parser.render(CALL))
    assert (content.strip(), calls, problems) == ("", [CALL], [])
    assert parser.calls_begin(parser.render(CALL)) == 0
    # the forced opening of a named call, completed, is that call
    text = parser.opening("get_weather") + '{"city": "Paris"}' + {"hermes": "}\n</tool_call>"}.get(name, "}")
    text += "]" if name == "mistral" else ""
    assert parser.parse(text)[1] == [CALL]
    assert parser.opening(None).endswith('{"name": "') and "get_weather" in parser.instructions([CALL])


@pytest.mark.parametrize(
    ("name", "text", "content", "calls"),
    [
        ("hermes", 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
         '<tool_call>{"name": "get_time", "parameters": {"city": "Rome", "hours": 24}}</tool_call>',
         "Let me look.", [CALL, OTHER]),
        ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
         '{"name": "get_time", "parameters": {"city": "Rome", "hours": 24}}', "", [CALL, OTHER]),
        ("llama3_json", 'The set {1, 2} has two members.', "The set {1, 2} has two members.", []),
        ("mistral", 'Checking.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
         '{"name": "get_time", "arguments": {"city": "Rome", "hours": 24}}]', "Checking.", [CALL, OTHER]),
        ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"city": "Rome", '
         '"hours": 24}', "", [CALL, OTHER]),
    ],
)  # fmt: skip
def test_replies_in_each_format(name, text, content, calls):
    got_content, got_calls, problems = tool_parser(name).parse(text)
    assert (got_content.strip(), got_calls, problems) == (content, calls, [])


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("hermes", "<tool_call>\n{not json}\n</tool_call>"),
        ("hermes", '<tool_call>\n["get_weather"]\n</tool_call>'),
        ("llama3_json", '{"name": "get_weather", "parameters": {"city": '),
        ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": '),
        ("mistral", "[TOOL_CALLS]get_weather"),
    ],
)
def test_a_broken_call_is_a_problem_in_the_tool_call_block(name, text):
    _, calls, problems = tool_parser(name).parse(text)
    assert calls == [] and len(problems) == 1 and problems[0]["part"] == "tool_calls"


def test_the_template_family_picks_the_format():
    assert detect_parser("{{ '[TOOL_CALLS]' + tool_calls|tojson }}") == "mistral"
    assert detect_parser("{%- if message.role == 'ipython' %}<|python_tag|>") == "llama3_json"
    assert detect_parser("{{ '<tool_call>\\n' }}") == detect_parser("{{ message['content'] }}") == "hermes"
    assert tool_parser("auto", "[TOOL_CALLS]").name == "mistral"
    with pytest.raises(
        AgentError, match=r"unknown tool-call parser 'pythonic': use one of \['auto', 'hermes'"
    ):
        tool_parser("pythonic")


def test_arguments_that_are_not_json_are_written_as_the_model_sent_them():
    broken = {"type": "function", "function": {"name": "f", "arguments": "{2"}}
    assert json.loads(tool_parser("hermes").render(broken).split("\n")[1])["arguments"] == "{2"
