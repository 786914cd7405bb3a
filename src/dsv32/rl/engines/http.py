"""The HTTP side of a remote rollout engine: one client that sends JSON to the engine's root and reads
JSON back, every failure an :class:`~dsv32.rl.engines.base.EngineError` that names the request."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from dsv32.engine.wire import problems
from dsv32.rl.engines.base import EngineError

APIS = ("dsv32", "vllm")
Reply = TypeVar("Reply", bound=BaseModel)
Body = TypeVar("Body", bound=BaseModel)


def wire_body(body_type: type[Body], **fields: Any) -> Body:
    """A request of ``body_type`` (a :mod:`dsv32.engine.wire` model) with ``fields``; fields the
    engine would refuse are an :class:`EngineError` here, before anything is sent."""
    try:
        return body_type(**fields)
    except ValidationError as err:
        raise EngineError(f"a {body_type.__name__} the engine would refuse: {problems(err)}") from None


class EngineClient:
    """Requests to the engine at ``url`` (its root, e.g. ``http://127.0.0.1:8000``; a trailing
    ``/v1`` is dropped). ``api``: ``"dsv32"`` (``dsv32 serve``) or ``"vllm"``, the dialect the
    weight syncs speak; ``timeout``: seconds per request. Constructing one sends nothing."""

    def __init__(self, url: str, *, api: str = "dsv32", timeout: float = 600.0, api_key: str | None = None):
        if api not in APIS:
            raise EngineError(f"unknown engine api {api!r}; known: {', '.join(map(repr, APIS))}")
        self.url = url.rstrip("/").removesuffix("/v1")
        self.api = api
        self.timeout = timeout
        self.api_key = api_key

    def request(
        self, method: str, path: str, body: dict | BaseModel | None = None, timeout: float | None = None
    ) -> Any:
        """``method path`` with ``body`` as JSON (a wire model is sent as the fields it was given);
        the reply's JSON (``{}`` when empty)."""
        if isinstance(body, BaseModel):
            body = body.model_dump(exclude_unset=True)
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                text = resp.read().decode()
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:500]
            raise EngineError(f"{method} {self.url}{path}: HTTP {err.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as err:  # refused, unreachable, timed out
            raise EngineError(f"{method} {self.url}{path}: {getattr(err, 'reason', err)}") from None
        try:
            return json.loads(text) if text else {}
        except json.JSONDecodeError:
            raise EngineError(f"{method} {self.url}{path}: the reply is not JSON: {text[:200]!r}") from None

    def typed(
        self,
        reply_type: type[Reply],
        method: str,
        path: str,
        body: dict | BaseModel | None = None,
        timeout: float | None = None,
    ) -> Reply:
        """:meth:`request`, its reply read as ``reply_type`` (a :mod:`dsv32.engine.wire` model); a
        reply that does not fit is an :class:`EngineError` naming the fields that are wrong."""
        raw = self.request(method, path, body, timeout)
        try:
            return reply_type.model_validate(raw)
        except ValidationError as err:
            raise EngineError(
                f"{method} {self.url}{path}: the engine's reply is malformed: {problems(err)}"
            ) from None

    def pause(self, mode: str = "wait") -> None:
        self.request("POST", f"/pause?mode={mode}")

    def resume(self) -> None:
        self.request("POST", "/resume")
