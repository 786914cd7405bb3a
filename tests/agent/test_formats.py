"""The local backend's prompt formats on their own: the V3.2 format renders and tokenizes only what a
step adds, and its prompt is still the full rendering of the conversation, byte for byte and token for
token, whatever happens to the history (new user turns, discarded rounds, messages changed in place,
another mode or tool list)."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsv32.agent import Agent
from dsv32.agent.backends.base import Completion, Usage
from dsv32.agent.backends.formats import V32Format
from dsv32.chat import EOS, USER, attach_tools, encode, encode_messages, strip_tool_results

TOOLS = [
    {"type": "function", "function": {"name": "fetch", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "run", "parameters": {"type": "object", "properties": {}}}},
]
#: Texts that tokenize differently when cut (words, spaces, digits) or hold special-token strings.
TEXT = st.one_of(
    st.text(st.sampled_from("ab 1\n.<>/"), max_size=12),
    st.sampled_from(["", " ", "word", "42", "</result>", f"x{EOS}y", f"{USER}hi", "<think>", "多云"]),
)


def expected_text(messages: list[dict], tools: list[dict], thinking: bool) -> str:
    return encode_messages(
        attach_tools(strip_tool_results(messages), tools), "thinking" if thinking else "chat"
    )


def tool_round(data, step: int) -> list[dict]:
    n = data.draw(st.integers(1, 2), label="calls")
    assistant = {
        "role": "assistant",
        "content": data.draw(TEXT, label="content"),
        "reasoning_content": data.draw(TEXT, label="reasoning"),
        "tool_calls": [
            {
                "id": f"c{step}_{k}",
                "type": "function",
                "function": {"name": "fetch", "arguments": json.dumps({"i": step, "q": data.draw(TEXT)})},
            }
            for k in range(n)
        ],
    }
    results = [
        {"role": "tool", "tool_call_id": f"c{step}_{k}", "content": data.draw(TEXT, label="result")}
        for k in range(data.draw(st.integers(0, n), label="answered"))
    ]
    return [assistant, *results]


def complete(messages: list[dict]) -> list[dict]:
    """``messages`` with every pending tool call answered (the loop adds all results of a step)."""
    out = list(messages)
    for index in range(len(out) - 1, -1, -1):
        if out[index]["role"] == "assistant":
            calls = out[index].get("tool_calls") or []
            answered = len(out) - index - 1
            out += [{"role": "tool", "content": "r"} for _ in calls[answered:]]
            return out
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_v32_prompts_equal_a_full_rendering_whatever_the_history_does(v32_tokenizer, data):
    fmt = V32Format(v32_tokenizer)
    messages: list[dict] = [{"role": "user", "content": data.draw(TEXT, label="task")}]
    if data.draw(st.booleans(), label="system"):
        messages.insert(0, {"role": "system", "content": data.draw(TEXT, label="system prompt")})
    tools, thinking = TOOLS[:1], True
    for step in range(data.draw(st.integers(1, 10), label="steps")):
        op = data.draw(
            st.sampled_from(["round", "round", "round", "user", "discard", "mutate", "mode", "tools"])
        )
        if op == "round":
            messages = complete(messages) + tool_round(data, step)
        elif op == "user":  # a new round: the reasoning before it is dropped (thinking mode)
            messages = [*complete(messages), {"role": "user", "content": data.draw(TEXT, label="user")}]
        elif op == "discard":  # a context reset: the oldest rounds leave, the rest are new copies
            first = next(i for i, m in enumerate(messages) if m["role"] == "user") + 1
            rounds = [i for i in range(first, len(messages)) if messages[i]["role"] == "assistant"]
            cut = rounds[len(rounds) // 2] if rounds else first
            messages = messages[:first] + [dict(m) for m in messages[cut:]]
        elif op == "mutate":  # an earlier message changed in place
            target = messages[data.draw(st.integers(0, len(messages) - 1), label="at")]
            target["content"] = (target.get("content") or "") + data.draw(TEXT, label="more")
        elif op == "mode":
            thinking = not thinking
        else:
            tools = TOOLS[: data.draw(st.integers(0, 2), label="tools")]
        for _ in range(2):  # count_tokens, then complete: the second call reuses the first
            prompt = fmt.prompt(messages, tools, thinking)
            text = expected_text(messages, tools, thinking)
            assert prompt.text == text
            assert prompt.ids == v32_tokenizer.encode(text, add_special_tokens=False)


def test_v32_sees_an_earlier_message_changed_in_place(v32_tokenizer):
    fmt = V32Format(v32_tokenizer)
    messages = [{"role": "user", "content": "task"}]
    fmt.prompt(messages, TOOLS, True)
    messages[0]["content"] = "another task"
    messages += tool_round_fixed(0)
    assert fmt.prompt(messages, TOOLS, True).text == expected_text(messages, TOOLS, True)


def tool_round_fixed(step: int) -> list[dict]:
    return [
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": f"step {step}",
            "tool_calls": [
                {"id": f"c{step}", "type": "function", "function": {"name": "fetch", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": f"c{step}", "content": f"page {step}"},
    ]


class FormatBackend:
    """The local backend's prompt work (count_tokens, then complete) without a model: each reply calls
    ``fetch`` until ``steps`` replies were made."""

    def __init__(self, fmt, steps: int) -> None:
        self.fmt, self.steps, self.made = fmt, steps, 0

    def count_tokens(self, messages, tools, *, thinking=True) -> int:
        return len(self.fmt.prompt(messages, tools, thinking).ids)

    def complete(self, messages, tools, *, thinking=True, sampling=None, on_delta=None) -> Completion:
        prompt = self.fmt.prompt(messages, tools, thinking)
        self.made += 1
        message = {"role": "assistant", "content": "done", "reasoning_content": "enough"}
        if self.made < self.steps:
            call = {
                "type": "function",
                "function": {"name": "fetch", "arguments": json.dumps({"i": self.made})},
            }
            message = {"role": "assistant", "content": "", "reasoning_content": "more", "tool_calls": [call]}
        return Completion(
            message, Usage(len(prompt.ids), 1), "tool_calls" if self.made < self.steps else "stop"
        )


def fetch(i: int) -> str:
    """Fetch page i."""
    return f"page {i}: " + " ".join(f"word{j}" for j in range(50))


def test_v32_renders_and_tokenizes_each_message_once_per_episode(v32_tokenizer, monkeypatch):
    rendered, tokenized = [], []
    render = encode._render_assistant
    monkeypatch.setattr(
        encode, "_render_assistant", lambda index, *a: rendered.append(index) or render(index, *a)
    )
    fmt = V32Format(v32_tokenizer)
    tokenize = fmt._ids
    monkeypatch.setattr(fmt, "_ids", lambda text: tokenized.append(text) or tokenize(text))
    traj = Agent(FormatBackend(fmt, 40), [fetch]).run("Read the pages.")
    assert traj.stop_reason == "answer" and len(traj.steps) == 40
    # each reply is rendered once, in the prompt after it (at its index + 1: the system message with
    # the tools comes first); the last one is in no prompt
    assert rendered == [i + 1 for i, m in enumerate(traj.messages[:-1]) if m["role"] == "assistant"]
    assert "".join(tokenized) == fmt.last.text
