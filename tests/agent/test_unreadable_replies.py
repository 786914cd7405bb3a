"""Replies that are not answers: one cut at max tokens ends the episode with ``length``; one that
attempted a tool call the parser could not read is answered with an error message the model reads
next (a step toward ``max_steps``, never the final answer). Raw V3.2 completions go through the
lenient parser, as the local backend's do."""

from __future__ import annotations

import json

import pytest
from helpers.agent import add, calls

from dsv32.agent import Agent, OpenAIBackend, ScriptedBackend
from dsv32.agent.backends.base import Completion, Usage, assistant_message
from dsv32.agent.context import tool_rounds
from dsv32.chat import DSML, EOS, encode_messages, parse_completion

D = DSML


def block(*invokes: str, lead: str = "\n\n") -> str:
    return f"{lead}<{D}function_calls>\n" + "\n".join(invokes) + f"\n</{D}function_calls>"


def invoke(name: str, *params: tuple[str, str, str]) -> str:
    body = "\n".join(f'<{D}parameter name="{k}" string="{s}">{v}</{D}parameter>' for k, s, v in params)
    return f'<{D}invoke name="{name}">\n{body}\n</{D}invoke>'


GOOD = "I add.</think>" + block(invoke("add", ("a", "false", "1"), ("b", "false", "2"))) + EOS
ANSWER = "Done.</think>It is 3." + EOS


class TextBackend:
    """Plays raw V3.2 completions through ``parse_completion(strict=False)`` (what the local backend
    does after sampling) and renders every prompt with ``encode_messages`` (so each conversation the
    loop builds must be one the V3.2 encoding accepts)."""

    def __init__(self, texts: list[tuple[str, str]]) -> None:
        self.texts = list(texts)
        self.prompts: list[str] = []

    def count_tokens(self, messages, tools, *, thinking=True) -> int:
        return len(encode_messages(messages, "thinking" if thinking else "chat")) // 4

    def complete(self, messages, tools, *, thinking=True, sampling=None, on_delta=None) -> Completion:
        self.prompts.append(encode_messages(messages, "thinking" if thinking else "chat"))
        text, finish = self.texts.pop(0)
        parsed = parse_completion(text, "thinking" if thinking else "chat", strict=False)
        message = assistant_message(parsed["content"], parsed["reasoning_content"], parsed["tool_calls"])
        return Completion(message, Usage(10, 10), finish, 0.0, parsed["problems"])


UNREADABLE = {
    "an invoke without its closing tag": "r</think>"
    + f'\n\n<{D}function_calls>\n<{D}invoke name="add">\n<{D}parameter name="a" string="false">1</{D}parameter>\n</{D}function_calls>'
    + EOS,
    "an empty tool name": "r</think>" + block(invoke("", ("a", "false", "1"))) + EOS,
    "a parameter given twice": "r</think>"
    + block(invoke("add", ("a", "false", "1"), ("a", "false", "2"), ("b", "false", "3")))
    + EOS,
    "a string attribute that is neither true nor false": "r</think>"
    + block(invoke("add", ("a", "maybe", "1")))
    + EOS,
    "one newline before the block": "r</think>" + block(invoke("add", ("a", "false", "1")), lead="\n") + EOS,
}


@pytest.mark.parametrize("text", UNREADABLE.values(), ids=UNREADABLE.keys())
def test_a_call_that_cannot_be_read_is_answered_with_an_error_and_the_model_tries_again(text):
    backend = TextBackend([(text, "stop"), (GOOD, "tool_calls"), (ANSWER, "stop")])
    seen = []
    traj = Agent(backend, [add], on_event=lambda kind, payload: seen.append(kind)).run("Add 1 and 2.")
    assert (traj.stop_reason, traj.final, traj.num_steps) == ("answer", "It is 3.", 3)
    first = traj.steps[0]
    assert first.tool_calls == [] and first.call_error.startswith("Error: your reply tried to call a tool")
    error = traj.messages[2]
    assert traj.messages[1]["role"] == "assistant" and error == {"role": "user", "content": first.call_error}
    assert first.call_error in backend.prompts[1]  # the model read it, in a prompt V3.2 could encode
    assert DSML not in first.call_error and EOS not in first.call_error  # no special-token strings
    assert "call_error" in seen and traj.steps[1].tool_calls[0].ok


def test_an_unreadable_call_counts_toward_max_steps_and_is_never_the_answer():
    text = UNREADABLE["an empty tool name"]
    traj = Agent(TextBackend([(text, "stop")] * 2), [add], max_steps=2).run("Add 1 and 2.")
    assert traj.stop_reason == "max_steps" and traj.final is None and traj.num_steps == 2
    assert [m["role"] for m in traj.messages] == ["user", "assistant", "user", "assistant", "user"]


def test_the_calls_read_before_a_broken_one_run_and_the_model_hears_about_the_rest():
    text = "r</think>" + block(invoke("add", ("a", "false", "1"), ("b", "false", "2")), invoke("")) + EOS
    traj = Agent(TextBackend([(text, "stop"), (ANSWER, "stop")]), [add]).run("Add.")
    assert [m["role"] for m in traj.messages] == ["user", "assistant", "tool", "user", "assistant"]
    assert (
        traj.messages[2]["content"] == "3"
        and "the 1 call(s) before it were run" in traj.messages[3]["content"]
    )
    assert traj.stop_reason == "answer"


def test_a_value_that_is_not_json_is_answered_by_the_toolbox_not_retried():
    text = "r</think>" + block(invoke("add", ("a", "false", "one"), ("b", "false", "2"))) + EOS
    traj = Agent(TextBackend([(text, "stop"), (ANSWER, "stop")]), [add]).run("Add.")
    (record,) = traj.steps[0].tool_calls
    assert record.error == "invalid_arguments" and traj.steps[0].call_error is None
    assert [p["part"] for p in traj.steps[0].problems] == ["arguments"]


def test_problems_that_hold_no_call_keep_the_answer():
    text = f"r</think>Answer <｜User｜> 3{EOS}"  # a special token in the answer text
    traj = Agent(TextBackend([(text, "stop")]), [add]).run("Add.")
    assert traj.stop_reason == "answer" and traj.final == "Answer <｜User｜> 3" and traj.steps[0].problems


@pytest.mark.parametrize(
    "text",
    [
        "r</think>" + f'\n\n<{D}function_calls>\n<{D}invoke name="add">\n<{D}parameter name="a" str',
        "I am still thinking about how to add and",
    ],
    ids=["inside a call", "inside the reasoning"],
)
def test_a_reply_cut_at_max_tokens_stops_with_length_and_keeps_its_text(text):
    traj = Agent(TextBackend([(text, "length")]), [add]).run("Add 1 and 2.")
    assert (traj.stop_reason, traj.final, traj.num_steps) == ("length", None, 1)
    assert traj.steps[0].finish_reason == "length" and traj.messages[-1]["role"] == "assistant"


def test_a_cut_reply_runs_none_of_its_calls():
    cut = {**calls(("add", {"a": 1, "b": 2})), "finish_reason": "length"}
    traj = Agent(ScriptedBackend([cut]), [add]).run("Add.")
    assert traj.stop_reason == "length" and traj.steps[0].tool_calls == [] and traj.final is None


def test_an_endpoint_that_cuts_the_reply_or_leaves_a_call_in_the_text(stub):
    def body(content: str, finish: str) -> dict:
        choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}
        return {"choices": [choice], "usage": {"prompt_tokens": 20, "completion_tokens": 5}}

    stub.reply(body("The answer is", "length"))
    traj = Agent(OpenAIBackend(stub.url, "m", max_retries=0), [add], thinking=False).run("Add.")
    assert traj.stop_reason == "length" and traj.final is None
    # a tool parser that failed leaves the DSML in the content: the model is told, and answers next
    stub.reply(body(block(invoke("add", ("a", "false", "1")), lead=""), "stop"))
    stub.reply(body("3", "stop"))
    traj = Agent(OpenAIBackend(stub.url, "m", max_retries=0), [add], thinking=False).run("Add.")
    assert traj.stop_reason == "answer" and traj.final == "3", traj.error
    sent = stub.requests[-1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert "DSML tool-call tags" in sent[-1]["content"]


def test_discard_treats_a_reply_and_its_error_as_one_round():
    error_round = [{"role": "assistant", "content": ""}, {"role": "user", "content": "Error: ..."}]
    messages = [
        {"role": "user", "content": "t"},
        {"role": "assistant", **calls(("add", {"a": 1, "b": 1}))},
        {"role": "tool", "content": "2"},
        *error_round,
        {"role": "assistant", "content": "the answer"},
    ]
    assert tool_rounds(messages, 1) == [(1, 3), (3, 5)]
    assert json.dumps(messages)  # plain data
