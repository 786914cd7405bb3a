"""Every HTTP request counted once, with the status its client saw, and no exception left without
OpenAI's error JSON.

:class:`RequestAccounting` is a plain ASGI middleware (it sees the body of a stream go out, which a
``BaseHTTPMiddleware`` does not): a request counts in ``dsv32_requests_total`` when its response is
complete, under the status it was sent with; a request whose client went away first (a
``http.disconnect`` before the last body part, or a send that fails) counts under
``status="499"`` (nginx's "client closed request"), whatever status its response had begun with. An
exception raised before the response began becomes a 500 in OpenAI's error JSON, logged with its
traceback; one raised in the middle of a stream ends the stream (the client sees it cut short).
"""

from __future__ import annotations

import json
import logging

from dsv32.serve.errors import ServeError
from dsv32.serve.metrics import Metrics

logger = logging.getLogger(__name__)

#: The status a request counts under when its client disconnected before the response was complete.
CLIENT_CLOSED = "499"


class RequestAccounting:
    def __init__(self, app, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = {"status": None, "complete": False, "gone": False}

        async def receive_watched():
            message = await receive()
            if message["type"] == "http.disconnect" and not state["complete"]:
                state["gone"] = True
            return message

        async def send_watched(message) -> None:
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
            try:
                await send(message)
            except OSError:
                state["gone"] = True
                raise
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                state["complete"] = True

        try:
            await self.app(scope, receive_watched, send_watched)
        except Exception as err:  # a bug: the client still gets OpenAI's error JSON, the log the traceback
            logger.error("%s %s failed", scope.get("method"), scope.get("path"), exc_info=err)
            if state["status"] is None and not state["gone"]:
                await _internal_error(send_watched, err)
            elif state["status"] is None:
                state["status"] = 500
        finally:
            status = CLIENT_CLOSED if state["gone"] else str(state["status"] or 500)
            self.metrics.count("requests_total", endpoint=scope.get("path", ""), status=status)


async def _internal_error(send, err: Exception) -> None:
    message = f"internal server error: {type(err).__name__}: {err}"
    body = json.dumps(ServeError(message, status=500, type="server_error").body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 500, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
