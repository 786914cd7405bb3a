"""The HTTP side of a remote rollout engine: one client that sends JSON to the engine's root and reads
JSON back, every failure an :class:`~dsv32.rl.engines.base.EngineError` that names the request.

Retries are opt-in (``[engine] retries``, default 0): a request that could not reach the engine
(refused, reset, cut short) or that it answered with a 5xx is sent again, at most ``retries`` more
times, after ``backoff`` seconds, doubling each time; :attr:`EngineClient.retried` counts them (the
trainer records them per step as ``engine_retries``). A 4xx is the request's own fault and a
time-out may still be running on the engine, so neither is retried, nor is anything the reply
says (a version mismatch is an error of the sync that reads it, not of the request).
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from dsv32.engine.wire import problems
from dsv32.rl.engines.base import EngineError

APIS = ("dsv32", "vllm")
Reply = TypeVar("Reply", bound=BaseModel)
Body = TypeVar("Body", bound=BaseModel)

logger = logging.getLogger(__name__)


class _Transient(Exception):
    """A failure a retry may outlast, carrying the :class:`EngineError` to raise when none is left."""

    def __init__(self, error: EngineError) -> None:
        super().__init__(str(error))
        self.error = error


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
    weight syncs speak; ``timeout``: seconds per request; ``retries``: how many more times a request
    that failed to reach the engine or got a 5xx is sent, after ``backoff`` seconds doubling each time
    (module doc). Constructing one sends nothing."""

    def __init__(
        self,
        url: str,
        *,
        api: str = "dsv32",
        timeout: float = 600.0,
        api_key: str | None = None,
        retries: int = 0,
        backoff: float = 1.0,
    ):
        if api not in APIS:
            raise EngineError(f"unknown engine api {api!r}; known: {', '.join(map(repr, APIS))}")
        if retries < 0 or backoff < 0:
            raise EngineError(f"engine retries and backoff must be >= 0, got {retries} and {backoff:g}")
        self.url = url.rstrip("/").removesuffix("/v1")
        self.api = api
        self.timeout = timeout
        self.api_key = api_key
        self.retries, self.backoff = retries, backoff
        self.retried = 0  # requests sent again, over this client's life
        self._count = threading.Lock()  # the engine's calls of one batch run on threads

    def request(
        self,
        method: str,
        path: str,
        body: dict | BaseModel | None = None,
        timeout: float | None = None,
        *,
        retry: bool = True,
        text: bool = False,
    ) -> Any:
        """``method path`` with ``body`` as JSON (a wire model is sent as the fields it was given);
        the reply's JSON (``{}`` when empty), or with ``text`` its text as it is (vLLM answers its
        LoRA routes in plain text). ``retry=False``: sent once whatever ``retries`` says (a request
        paired with a collective the other side has begun)."""
        if isinstance(body, BaseModel):
            body = body.model_dump(exclude_unset=True)
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        left = self.retries if retry else 0
        wait = self.backoff
        while True:
            try:
                body_text = self._send(req, timeout or self.timeout)
                break
            except _Transient as failure:
                if left == 0:
                    raise failure.error from None
                logger.warning("%s; sent again in %g s (%d retries left)", failure.error, wait, left - 1)
                with self._count:
                    self.retried += 1
                time.sleep(wait)
                left, wait = left - 1, wait * 2
        if text:
            return body_text
        try:
            return json.loads(body_text) if body_text else {}
        except json.JSONDecodeError:
            raise EngineError(
                f"{method} {self.url}{path}: the reply is not JSON: {body_text[:200]!r}"
            ) from None

    def _send(self, req: urllib.request.Request, timeout: float) -> str:
        """One attempt: the reply's text; a :class:`_Transient` for what a retry may outlast, an
        :class:`EngineError` for the rest."""
        where = f"{req.get_method()} {req.full_url}"
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.read().decode()
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:500]
            error = EngineError(f"{where}: HTTP {err.code}: {detail}")
            if err.code >= 500:
                raise _Transient(error) from None
            raise error from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as err:  # refused, reset, late
            reason = getattr(err, "reason", err)
            error = EngineError(f"{where}: {reason or type(err).__name__}")
            if isinstance(reason, TimeoutError):  # it may still run on the engine: not sent twice
                raise error from None
            raise _Transient(error) from None

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
