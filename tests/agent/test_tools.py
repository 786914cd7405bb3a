"""Tools: schemas from signatures and docstrings, explicit schemas, and every kind of bad call
becoming an error text instead of an exception."""

from __future__ import annotations

import json
import threading
from typing import Literal

import pytest
from pydantic import BaseModel

from dsv32.agent import AgentError, Tool, Toolbox, tool
from dsv32.agent.schema import check_arguments, parse_docstring


def convert(value: float, unit: Literal["m", "km"] = "m", tags: list[str] | None = None) -> dict:
    """Convert a length.

    Longer explanation that is part of the description.

    Args:
        value: the length to convert
            (continued on a second line).
        unit: the target unit.
        tags: labels to echo back.

    Returns:
        the converted value.
    """
    return {"value": value * (1000 if unit == "m" else 1), "unit": unit, "tags": tags or []}


def call(name: str, arguments) -> dict:
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}


def test_schema_comes_from_type_hints_and_docstring():
    t = tool(convert)
    fn = t.schema["function"]
    assert fn["name"] == "convert"
    assert fn["description"] == "Convert a length.\n\nLonger explanation that is part of the description."
    params = fn["parameters"]
    assert params["type"] == "object" and params["required"] == ["value"]
    assert params["additionalProperties"] is False
    assert params["properties"]["value"] == {
        "type": "number",
        "description": "the length to convert (continued on a second line).",
    }
    assert params["properties"]["unit"]["enum"] == ["m", "km"]
    assert params["properties"]["unit"]["default"] == "m"
    assert "title" not in json.dumps(params)


def test_sphinx_docstrings_and_decorator_forms():
    @tool(name="lookup", timeout_s=3)
    def find(key: str, limit: int = 5) -> str:
        """Find a key.

        :param key: what to look for
        :param limit: at most this many
        :returns: the matches
        """
        return key * limit

    assert isinstance(find, Tool) and find.name == "lookup" and find.timeout_s == 3
    props = find.parameters["properties"]
    assert props["key"]["description"] == "what to look for"
    assert props["limit"]["description"] == "at most this many"
    assert find.description == "Find a key."
    assert parse_docstring(None) == ("", {})


def test_signatures_that_cannot_be_tools_are_rejected():
    def star(*args: int) -> int:
        return 0

    with pytest.raises(AgentError, match="named arguments only"):
        tool(star)
    with pytest.raises(AgentError, match="unique"):
        Toolbox([convert, convert])
    with pytest.raises(AgentError, match="must be an OpenAI tool"):
        tool(convert, schema={"type": "string"})


def test_a_good_call_runs_and_non_string_results_are_json():
    box = Toolbox([convert])
    out = box.execute(call("convert", {"value": 2, "unit": "m", "tags": ["a"]}))
    assert out.ok and out.error is None
    assert json.loads(out.content) == {"value": 2000, "unit": "m", "tags": ["a"]}

    class Point(BaseModel):
        x: int

    box = Toolbox([tool(lambda: Point(x=1), name="origin")])
    assert box.execute(call("origin", "")).content == '{"x":1}'  # empty arguments mean {}


@pytest.mark.parametrize(
    ("name", "arguments", "kind", "text"),
    [
        ("nope", {}, "unknown_tool", "unknown tool 'nope'. The available tools are: convert."),
        ("convert", '{"value": 1,', "bad_json", "are not valid JSON"),
        ("convert", "[1, 2]", "bad_json", "must be a JSON object, got a JSON list"),
        ("convert", {"value": "1"}, "invalid_arguments", "value: Input should be a valid number (got '1')"),
        ("convert", {}, "invalid_arguments", "value: Field required"),
        ("convert", {"value": 1, "unit": "mi"}, "invalid_arguments", "unit: Input should be 'm' or 'km'"),
        (
            "convert",
            {"value": 1, "colour": "red"},
            "invalid_arguments",
            "colour: Extra inputs are not permitted",
        ),
        ("convert", {"value": 1, "tags": [1]}, "invalid_arguments", "tags.0: Input should be a valid string"),
    ],
)
def test_bad_calls_become_error_messages(name, arguments, kind, text):
    out = Toolbox([convert]).execute(call(name, arguments))
    assert not out.ok and out.error == kind
    assert out.content.startswith("Error: ")
    assert text in out.content


def test_every_schema_problem_is_listed_at_once():
    out = Toolbox([convert]).execute(call("convert", {"unit": 3, "tags": "x"}))
    lines = [line for line in out.content.splitlines() if line.startswith("- ")]
    assert len(lines) == 3  # value missing, unit wrong, tags wrong


def test_explicit_schema_is_checked_before_the_call():
    seen = []
    schema = {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "minLength": 1},
                    "top_k": {"type": "integer", "minimum": 1, "maximum": 10},
                    "mode": {"enum": ["web", "news"]},
                    "filters": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
                },
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    }
    box = Toolbox([tool(lambda **kw: seen.append(kw) or "ok", schema=schema)])
    assert box.tools["search"].description == "Search the web."
    assert box.execute(call("search", {"query": "x", "top_k": 3.0})).ok  # 3.0 is a JSON integer
    bad = box.execute(
        call("search", {"query": "", "top_k": 0, "mode": "video", "filters": [1, "a", "b"], "z": 1})
    )
    assert bad.error == "invalid_arguments"
    for text in (
        "query: shorter than 1 characters",
        "top_k: must be >= 1, got 0",
        "mode: must be one of ['web', 'news']",
        "filters: more than 2 items",
        "filters[0]: expected string, got integer 1",
        "z: unknown field (allowed: query, top_k, mode, filters)",
    ):
        assert text in bad.content
    assert box.execute(call("search", {"top_k": True})).content.count("- ") == 2  # missing query, bool
    assert seen == [{"query": "x", "top_k": 3.0}]


def test_check_arguments_follows_refs_and_alternatives():
    schema = {
        "type": "object",
        "properties": {"p": {"$ref": "#/$defs/P"}, "n": {"anyOf": [{"type": "integer"}, {"type": "null"}]}},
        "$defs": {"P": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}},
    }
    assert check_arguments({"p": {"x": 1.5}, "n": None}, schema) == []
    assert check_arguments({"p": {}, "n": "a"}, schema) == [
        "p.x: required field missing",
        "n: matches none of the allowed forms (anyOf)",
    ]


def test_a_raising_tool_is_reported():
    def fail(x: int) -> int:
        raise ValueError(f"cannot handle {x}")

    out = Toolbox([fail]).execute(call("fail", {"x": 7}))
    assert out.error == "exception" and out.content == "Error: fail raised ValueError: cannot handle 7"
    inline = Toolbox([fail], timeout_s=None).execute(call("fail", {"x": 7}))
    assert inline.content == out.content


class _Unprintable:
    def __repr__(self) -> str:
        raise RuntimeError("repr fails")

    __str__ = __repr__


def test_results_that_cannot_be_written_and_exits_are_reported_with_or_without_a_timeout():
    def circular() -> list:
        loop: list = []
        loop.append(loop)
        return loop

    def odd() -> object:
        return _Unprintable()

    class Strange(Exception):
        def __str__(self) -> str:
            raise ValueError("str fails")

    def strange() -> None:
        raise Strange()

    def leave() -> None:
        raise SystemExit(3)

    for timeout in (5, None):
        box = Toolbox([circular, odd, strange, leave], timeout_s=timeout)
        out = box.execute(call("circular", {}))
        assert out.error == "unreadable_result" and out.content == (
            "Error: circular returned a list that cannot be written as text "
            "(ValueError: Circular reference detected)."
        )
        assert box.execute(call("odd", {})).error == "unreadable_result"
        assert box.execute(call("strange", {})).content == (
            "Error: strange raised Strange: <Strange that cannot be shown>"
        )
        assert box.execute(call("leave", {})).error == "exception"


def test_a_slow_tool_times_out_and_is_abandoned():
    release = threading.Event()

    def slow() -> str:
        release.wait(10)
        return "late"

    box = Toolbox([tool(slow, timeout_s=0.05)], timeout_s=30)
    out = box.execute(call("slow", {}))
    release.set()
    assert out.error == "timeout"
    assert out.content == "Error: slow did not finish within 0.05 s and was abandoned (timed out)."
    fast = Toolbox([tool(lambda: "quick", name="fast")], timeout_s=5).execute(call("fast", {}))
    assert fast.ok and fast.content == "quick"


def test_long_output_is_truncated_with_a_marker():
    box = Toolbox([tool(lambda n: "x" * n, name="text", schema={"type": "object"})], max_output_chars=100)
    out = box.execute(call("text", {"n": 250}))
    assert out.ok and out.truncated
    assert out.content == "x" * 100 + "\n[... output truncated: showing the first 100 of 250 characters]"
    assert not box.execute(call("text", {"n": 100})).truncated
