"""Shared pieces of the agent tests: scripted replies and a backend with a predictable token count."""

from __future__ import annotations

import json

from dsv32.agent import ScriptedBackend


def calls(*pairs: tuple[str, object]) -> dict:
    """An assistant message calling tools: ``calls(("add", {"a": 1}), ...)``; a str is sent as is."""
    return {
        "reasoning_content": f"calling {len(pairs)} tool(s)",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": name, "arguments": a if isinstance(a, str) else json.dumps(a)},
            }
            for name, a in pairs
        ],
    }


def answer(text: str) -> dict:
    return {"reasoning_content": "done", "content": text}


class CountingBackend(ScriptedBackend):
    """Scripted replies; a prompt costs ``per_message`` tokens per message (the trigger is exact)."""

    def __init__(self, replies, per_message: int = 10) -> None:
        super().__init__(replies)
        self.per_message = per_message

    def count_tokens(self, messages, tools, *, thinking=True) -> int:
        return self.per_message * len(messages)


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b
