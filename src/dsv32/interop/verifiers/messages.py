"""Conversations between dsv32's OpenAI-style message dicts and verifiers' typed messages and traces."""

from __future__ import annotations

import json
from typing import Any

import verifiers.v1 as vf
from pydantic import TypeAdapter
from verifiers.v1.graph import MessageNode
from verifiers.v1.state import state_cls
from verifiers.v1.trace import AgentInfo, Trace, TraceTask
from verifiers.v1.types import content_text

from dsv32.interop.errors import InteropError

_MESSAGE = TypeAdapter(vf.Message)


def to_openai(messages: list[Any]) -> list[dict]:
    """verifiers messages as OpenAI-style dicts (text content; tool calls with JSON-string arguments)."""
    out = []
    for message in messages:
        row: dict[str, Any] = {"role": message.role, "content": content_text(message.content)}
        if message.role == "assistant":
            row["content"] = message.content or ""
            if message.reasoning_content:
                row["reasoning_content"] = message.reasoning_content
            if message.tool_calls:
                row["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in message.tool_calls
                ]
        elif message.role == "tool":
            row["tool_call_id"] = message.tool_call_id
        out.append(row)
    return out


def to_verifiers(messages: list[dict]) -> list[Any]:
    """OpenAI-style dicts as verifiers messages."""
    out = []
    for i, message in enumerate(messages):
        row = {
            k: v for k, v in message.items() if k in ("role", "content", "tool_call_id", "reasoning_content")
        }
        if message.get("role") == "assistant" and message.get("tool_calls"):
            row["tool_calls"] = []
            for call in message["tool_calls"]:
                function = call.get("function") or {}
                arguments = function.get("arguments", "")
                if not isinstance(arguments, str):
                    arguments = json.dumps(arguments, ensure_ascii=False)
                row["tool_calls"].append({"id": call.get("id") or f"call-{i}", "name": function.get("name", ""),
                                          "arguments": arguments})  # fmt: skip
        if row.get("content") is None:
            row["content"] = "" if row.get("role") != "assistant" else None
        try:
            out.append(_MESSAGE.validate_python(row))
        except ValueError as err:
            raise InteropError(f"message {i} is not an OpenAI-style chat message: {err}") from err
    return out


def new_trace(task: vf.Task) -> Trace:
    """An empty trace of ``task``, with the state type its task class declares."""
    return Trace(
        task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
        agent=AgentInfo(config=vf.AgentConfig()),
        state=state_cls(type(task))(),
    )


def fill_trace(trace: Trace, messages: list[dict], final: str | None) -> Trace:
    """``trace`` holding the conversation ``messages`` (one branch; assistant turns as sampled) and
    ``final`` as the agent's reply."""
    nodes = []
    for i, message in enumerate(to_verifiers(messages)):
        nodes.append(
            MessageNode(parent=i - 1 if i else None, message=message, sampled=message.role == "assistant")
        )
    trace.nodes = nodes
    trace.root_reply = final
    return trace


def trace_of(task: vf.Task, messages: list[dict], final: str | None = None) -> Trace:
    """A trace of ``task`` holding ``messages`` — what a rollout of them would have recorded."""
    return fill_trace(new_trace(task), messages, final)
