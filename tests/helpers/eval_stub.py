"""A scripted OpenAI-compatible endpoint on 127.0.0.1 for tests: ``reply(request) -> assistant
message`` decides every answer; requests are recorded."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class StubEndpoint:
    """``window``: the ``max_model_len`` its ``GET /v1/models`` reports (None: that route is 404)."""

    def __init__(self, reply: Callable[[dict], dict | int], window: int | None = None) -> None:
        self.reply = reply
        self.window = window
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                return None

            def do_GET(self) -> None:
                if stub.window is None or not self.path.endswith("/models"):
                    self._send(404, {"error": {"message": "not found", "type": "not_found"}})
                    return
                card = {"id": "stub-model", "object": "model", "max_model_len": stub.window}
                self._send(200, {"object": "list", "data": [card]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with stub.lock:
                    stub.requests.append(body)
                message = stub.reply(body)
                if isinstance(message, int):  # an HTTP error status
                    self._send(message, {"error": {"message": "scripted failure", "type": "server_error"}})
                    return
                if isinstance(message, str):  # an HTTP 400 with this message
                    self._send(400, {"error": {"message": message, "type": "invalid_request_error"}})
                    return
                calls = message.get("tool_calls") or []
                choice = {"index": 0, "finish_reason": "tool_calls" if calls else "stop",
                          "message": {"role": "assistant", "content": message.get("content") or "",
                                      **({"tool_calls": calls} if calls else {})}}  # fmt: skip
                usage = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
                self._send(200, {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                                 "choices": [choice], "usage": usage})  # fmt: skip

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
                    return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> StubEndpoint:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
