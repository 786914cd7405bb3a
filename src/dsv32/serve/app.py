"""The FastAPI application of ``dsv32 serve``: OpenAI-compatible endpoints over one local model.

- ``POST /v1/chat/completions`` — messages → prompt (V3.2 format or the model's chat template) →
  continuous-batched generation → a message with ``reasoning_content``/``content``/``tool_calls``
  (DSML calls on a V3.2 model, the tool-call parser's on a chat-template model), or a stream of SSE
  chunks (``data: {...}`` lines, then ``data: [DONE]``);
- ``POST /v1/completions`` — a raw prompt (text or token ids) → text;
- ``GET /v1/models`` (with ``max_model_len``, the window, and ``max_tokens_default``, what a chat
  request without ``max_tokens`` may generate: null for the rest of the window), ``GET /health``,
  ``GET /metrics`` (Prometheus text);
- ``POST /tokenize`` (as vLLM's) — the prompt a chat or completion request would run: ``tokens``,
  ``count``, ``max_model_len`` and the prompt text itself.

Every refusal is OpenAI's error JSON (:mod:`dsv32.serve.errors`): request validation errors are 400
(not FastAPI's 422), a wrong API key 401, an unknown model 404, a full queue 503, and anything
unforeseen 500 (logged with its traceback).
"""

from __future__ import annotations

import json
import logging
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from dsv32.serve import responses as R
from dsv32.serve.errors import ServeError, invalid, unauthorized, unknown_model
from dsv32.serve.jobs import ClientGone, JobEvents, token_budget
from dsv32.serve.metrics import Metrics
from dsv32.serve.middleware import RequestAccounting
from dsv32.serve.protocol import ChatCompletionRequest, CompletionRequest, TokenizeRequest, check_text
from dsv32.serve.rl_routes import register_rl_routes
from dsv32.serve.runtime import ServedModel
from dsv32.serve.scheduler import Chunk, Finished, Scheduler

logger = logging.getLogger(__name__)


def _sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


def _validation_message(err: RequestValidationError) -> tuple[str, str | None]:
    problems, param = [], None
    for e in err.errors():
        loc = [str(x) for x in e.get("loc", ()) if x != "body"]
        if e.get("type") == "json_invalid":  # its location is a character offset, not a field
            problems.append(
                f"the body is not valid JSON (at character {'.'.join(loc) or '?'}: {e.get('msg')})"
            )
            continue
        param = param or (loc[0] if loc else None)
        problems.append(f"{'.'.join(loc) or 'body'}: {e.get('msg')}")
    return "invalid request: " + "; ".join(problems), param


def create_app(
    served: ServedModel,
    *,
    max_batch: int = 8,
    max_queue: int = 64,
    api_key: str | None = None,
    max_tokens_default: int | None = None,
    rl_routes: bool = False,
    prefix_cache_bytes: int = 2**30,
) -> FastAPI:
    """The application; its scheduler thread runs while the app's lifespan does. A model whose KV
    caches cannot be batched (sliding window) with ``max_batch > 1`` is a
    :class:`~dsv32.engine.batch.BatchError` naming ``--max-batch 1``. A chat request without
    ``max_tokens`` may generate ``max_tokens_default`` tokens, or (None) the rest of the window.
    ``rl_routes``: also serve the RL routes that pause the server and load weights
    (:data:`~dsv32.serve.rl_routes.CONTROL_ROUTES`; ``--enable-rl-routes``), a 404 otherwise.
    ``prefix_cache_bytes``: the bound of the prefix cache across requests (0: none; see
    :mod:`dsv32.serve.scheduler`)."""
    metrics = Metrics()
    scheduler = Scheduler(
        served,
        max_batch=max_batch,
        max_queue=max_queue,
        metrics=metrics,
        prefix_cache_bytes=prefix_cache_bytes,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        scheduler.start()
        try:
            yield
        finally:
            scheduler.stop()

    app = FastAPI(title="dsv32 serve", lifespan=lifespan)
    app.state.scheduler = scheduler

    def authorize(request: Request) -> None:
        if api_key is not None and request.headers.get("authorization", "") != f"Bearer {api_key}":
            raise unauthorized()

    def check_model(name: str) -> None:
        if name != served.name:
            raise unknown_model(name, served.name)

    app.add_middleware(RequestAccounting, metrics=metrics)

    @app.exception_handler(ServeError)
    async def serve_error(request: Request, err: ServeError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, err: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(err)
        return JSONResponse(invalid(message, param).body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if err.status_code < 500 else "server_error"
        body = ServeError(str(err.detail), status=err.status_code, type=kind).body()
        return JSONResponse(body, status_code=err.status_code)

    register_rl_routes(app, served, scheduler, authorize, control_routes=rl_routes)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models", dependencies=[Depends(authorize)])
    async def models() -> dict[str, Any]:
        card = {"id": served.name, "object": "model", "created": 0, "owned_by": "dsv32"}
        # max_tokens_default null: a chat request without max_tokens may use the rest of the window
        limits = {"max_model_len": served.max_model_len, "max_tokens_default": max_tokens_default}
        return {"object": "list", "data": [card | limits]}

    @app.post("/tokenize", dependencies=[Depends(authorize)])
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        check_text(body)
        check_model(body.model)
        if (body.messages is None) == (body.prompt is None):
            raise invalid("pass either messages or prompt", "messages")
        if body.messages is not None:
            fields = body.model_dump(exclude={"prompt"}, exclude_none=True)
            prompt = served.chat_prompt(ChatCompletionRequest.model_validate(fields))
            text, ids = prompt.text, prompt.ids
        else:
            text, ids = body.prompt, list(served.tokenizer.encode(body.prompt))
        return {"count": len(ids), "max_model_len": served.max_model_len, "tokens": ids, "prompt": text}

    @app.post("/v1/chat/completions", dependencies=[Depends(authorize)])
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        check_text(body)
        check_model(body.model)
        prompt = served.chat_prompt(body)
        max_tokens = token_budget(served, body.token_limit, len(prompt.ids), "messages", max_tokens_default)
        top = (body.top_logprobs or 0) if body.logprobs else None
        job = JobEvents(
            scheduler, prompt.ids, body, max_tokens=max_tokens, top_logprobs=top,
            skip_special_tokens=False, grammar=prompt.grammar, eos_text=served.v32,
        )  # fmt: skip

        def parser():
            return served.stream(prompt)

        rid = R.new_id("chatcmpl")
        if body.stream:
            return StreamingResponse(
                _chat_stream(job, parser, rid, body, len(prompt.ids)), media_type="text/event-stream"
            )
        streams = [parser() for _ in range(body.n)]
        logprobs: list[list | None] = [[] if top is not None else None for _ in range(body.n)]
        reasons, completion_tokens = [""] * body.n, 0
        try:
            async for event in job.events(request):
                if isinstance(event, Chunk):
                    streams[event.index].feed(event.text)
                    if event.logprobs is not None:
                        logprobs[event.index] += event.logprobs
                else:
                    streams[event.index].finish()
                    reasons[event.index] = event.reason
                    completion_tokens += event.completion_tokens
        except ClientGone:
            return Response(status_code=499)
        choices = [R.chat_choice(i, s.message(), reasons[i], logprobs[i]) for i, s in enumerate(streams)]
        return JSONResponse(R.chat_completion(rid, served.name, choices, len(prompt.ids), completion_tokens))

    async def _chat_stream(job: JobEvents, parser, rid: str, body: ChatCompletionRequest, prompt_tokens: int):
        streams = [parser() for _ in range(body.n)]
        name, completion_tokens = served.name, 0

        def chunk(choice):
            return _sse(R.chat_chunk(rid, name, choice, None))

        for i in range(body.n):
            yield chunk(R.stream_choice(i, {"role": "assistant", "content": ""}))
        try:
            async for event in job.events():
                stream = streams[event.index]
                if isinstance(event, Chunk):
                    choices = R.delta_choices(event.index, stream.feed(event.text))
                    if event.logprobs is not None:
                        choices = choices or [R.stream_choice(event.index, {})]
                        choices[0]["logprobs"] = {"content": event.logprobs}
                    for choice in choices:
                        yield chunk(choice)
                    continue
                for choice in R.delta_choices(event.index, stream.finish()):
                    yield chunk(choice)
                completion_tokens += event.completion_tokens
                reason = R.finish_reason(event.reason, stream.message())
                yield chunk(R.stream_choice(event.index, {}, reason))
        except ServeError as err:
            yield _sse(err.body())
        else:
            if body.include_usage:
                yield _sse(R.chat_chunk(rid, name, None, R.usage(prompt_tokens, completion_tokens)))
        yield _sse("[DONE]")

    @app.post("/v1/completions", dependencies=[Depends(authorize)])
    async def completions(body: CompletionRequest, request: Request) -> Response:
        check_text(body)
        check_model(body.model)
        if isinstance(body.prompt, str):
            ids = list(served.tokenizer.encode(body.prompt))
        else:
            ids = list(body.prompt)
            vocab = served.vocab_size
            if any(not 0 <= t < vocab for t in ids):
                raise invalid(f"token ids must be in [0, {vocab})", "prompt")
        if not ids:
            raise invalid("the prompt has no tokens", "prompt")
        max_tokens = token_budget(served, body.max_tokens, len(ids), "prompt")
        top = body.logprobs
        job = JobEvents(
            scheduler, ids, body, max_tokens=max_tokens, top_logprobs=top, skip_special_tokens=not served.v32
        )
        rid = R.new_id("cmpl")
        if body.stream:
            return StreamingResponse(
                _completion_stream(job, rid, body, len(ids)), media_type="text/event-stream"
            )
        texts, entries = [""] * body.n, [[] for _ in range(body.n)]
        reasons, completion_tokens = [""] * body.n, 0
        try:
            async for event in job.events(request):
                if isinstance(event, Chunk):
                    texts[event.index] += event.text
                    entries[event.index] += event.logprobs or []
                else:
                    reasons[event.index] = event.reason
                    completion_tokens += event.completion_tokens
        except ClientGone:
            return Response(status_code=499)
        choices = [
            {
                "index": i,
                "text": texts[i],
                "logprobs": None if top is None else R.completion_logprobs(entries[i]),
                "finish_reason": reasons[i],
            }
            for i in range(body.n)
        ]
        return JSONResponse(
            R.completion_body(rid, served.name, choices, len(ids), completion_tokens, chunk=False)
        )

    async def _completion_stream(job: JobEvents, rid: str, body: CompletionRequest, prompt_tokens: int):
        completion_tokens, offsets = 0, [0] * body.n
        try:
            async for event in job.events():
                choice = {"index": event.index, "text": "", "logprobs": None, "finish_reason": None}
                if isinstance(event, Chunk):
                    choice["text"] = event.text
                    if event.logprobs is not None:
                        choice["logprobs"] = R.completion_logprobs(event.logprobs, offsets[event.index])
                        offsets[event.index] += sum(len(e["token"]) for e in event.logprobs)
                elif isinstance(event, Finished):
                    choice["finish_reason"] = event.reason
                    completion_tokens += event.completion_tokens
                yield _sse(R.completion_body(rid, served.name, [choice], prompt_tokens, 0, chunk=True))
        except ServeError as err:
            yield _sse(err.body())
        else:
            if body.include_usage:
                final = R.completion_body(rid, served.name, [], prompt_tokens, completion_tokens, chunk=False)
                yield _sse(final)
        yield _sse("[DONE]")

    return app
