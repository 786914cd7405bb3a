"""Shared pieces of the agent tests: scripted replies, a backend with a predictable token count, a stub
Chat Completions server and the replies it sends, an environment with a counter tool."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from dsv32.agent import ScriptedBackend
from dsv32.envs.base import Environment, Reward, Task, tool_call, tool_schema


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


class Stub:
    """Answers POST /v1/chat/completions with queued replies; records every request body.

    A reply's payload is JSON, or ``bytes`` sent as they are; a list is a stream of server-sent
    events, each a chunk written as JSON or ``bytes`` sent as the event's data. A ``Content-Type``
    header replaces the default one."""

    def __init__(self) -> None:
        self.replies: list[tuple[int, object, dict]] = []
        self.requests: list[dict] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append(body)
                status, payload, headers = stub.replies.pop(0)
                headers = dict(headers)
                stream = isinstance(payload, list)
                if stream:
                    events = [c.decode() if isinstance(c, bytes) else json.dumps(c) for c in payload]
                    data = "".join(f"data: {e}\n\n" for e in [*events, "[DONE]"]).encode()
                else:
                    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                default = "text/event-stream" if stream else "application/json"
                self.send_response(status)
                self.send_header("Content-Type", headers.pop("Content-Type", default))
                self.send_header("Content-Length", str(len(data)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def reply(self, payload, status: int = 200, **headers) -> None:
        self.replies.append((status, payload, headers))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def chunk(delta: dict | None = None, finish: str | None = None, usage: dict | None = None) -> dict:
    """One streamed Chat Completions chunk (no ``delta``: a usage-only chunk without choices)."""
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": choices,
        "usage": usage,
    }


def completion(message: dict, finish: str | None = None, usage: dict | None = None) -> dict:
    """A Chat Completions reply holding ``message``; ``finish`` is ``tool_calls`` when it calls tools,
    else ``stop``, unless given."""
    finish = finish or ("tool_calls" if message.get("tool_calls") else "stop")
    return {
        "id": "cmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
        "usage": usage or {"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55},
    }


class Counter(Environment):
    """A counter the agent increments; the task is solved when the answer states the final count."""

    name = "counter"

    def __init__(self) -> None:
        self.count, self.calls, self.resets = 0, [], 0

    def reset(self, task: Task) -> list[dict]:
        self.count, self.resets = 0, self.resets + 1
        return [{"role": "system", "content": "Use the counter."}, {"role": "user", "content": task.prompt}]

    def tools(self) -> list[dict]:
        return [tool_schema("increment", "Add n to the counter.", {"n": {"type": "integer", "minimum": 1}})]

    def call(self, name: str, arguments: dict) -> str:
        self.calls.append((name, arguments))
        self.count += arguments["n"]
        return f"count = {self.count}"

    def reward(self, trajectory) -> Reward:
        ok = trajectory.final is not None and trajectory.final.strip() == str(self.count) == str(
            self.task_answer
        )
        tools_seen = sum(m["role"] == "tool" for m in trajectory.messages)
        return Reward(float(ok), {"tool_results": tools_seen}, "right count" if ok else "wrong count")

    def reference(self, task: Task) -> list[dict]:
        return [
            {
                "content": "",
                "tool_calls": [
                    tool_call("increment", {"n": 2}, "r1"),
                    tool_call("increment", {"n": 1}, "r2"),
                ],
            },
            {"content": str(task.answer)},
        ]

    task_answer = 3
