"""A request's side of a :class:`~dsv32.serve.scheduler.Job`: building it, and reading its events on
the server's event loop.

The scheduler thread hands events over with ``loop.call_soon_threadsafe`` into an ``asyncio.Queue``.
:class:`JobEvents` yields them until every choice finished; leaving early (the client went away, a
stream was cancelled) marks the job cancelled, which frees its batch rows at the next decode step.
A non-streamed request listens for its client's disconnect while it waits, beside the events: the
job is cancelled the moment the server reads the disconnect, tokens flowing or not (a stream learns
of it from the server, which cancels the response).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from starlette.requests import Request

from dsv32.engine.constraint import Grammar
from dsv32.engine.sampling import SamplingParams
from dsv32.engine.wire import engine_top_k
from dsv32.serve.errors import ServeError, context_length_exceeded, invalid
from dsv32.serve.protocol import SamplingFields
from dsv32.serve.runtime import ServedModel
from dsv32.serve.scheduler import Chunk, Failed, Finished, Job, Scheduler

_GONE = object()  # put into a job's queue when its client disconnected


class ClientGone(Exception):
    """The client of a non-streamed request disconnected."""


def token_budget(
    served: ServedModel, requested: int | None, prompt_tokens: int, param: str, default: int | None = None
) -> int:
    """``max_tokens``: the request's, else ``default`` (``--max-tokens-default``) capped to the room the
    prompt leaves, else all of that room (vLLM's default); 400 when prompt + ``max_tokens`` exceed
    the model length."""
    room = served.max_model_len - prompt_tokens
    if requested is None:
        if room < 1:
            raise context_length_exceeded(prompt_tokens, 1, served.max_model_len, param)
        return room if default is None else min(default, room)
    if requested > room:
        raise context_length_exceeded(prompt_tokens, requested, served.max_model_len, param)
    return requested


def sampling_params(req: SamplingFields) -> SamplingParams:
    return SamplingParams(temperature=req.temperature, top_p=req.top_p, top_k=engine_top_k(req.top_k))


class JobEvents:
    """Submit a job and iterate over its events (see the module docstring)."""

    def __init__(
        self,
        scheduler: Scheduler,
        prompt_ids: list[int],
        req: SamplingFields,
        *,
        max_tokens: int,
        top_logprobs: int | None,
        skip_special_tokens: bool,
        grammar: Grammar | None = None,
        eos_text: bool = True,
    ) -> None:
        if req.n > scheduler.max_batch:
            raise invalid(
                f"n={req.n} exceeds this server's batch size {scheduler.max_batch} (--max-batch)", "n"
            )
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.n = req.n
        self.started = time.monotonic()
        self.first_token_at: float | None = None
        self.job = Job(
            prompt_ids=prompt_ids,
            max_tokens=max_tokens,
            params=sampling_params(req),
            emit=self._emit,
            n=req.n,
            seed=req.seed,
            stops=list(req.stop or []),
            top_logprobs=top_logprobs,
            skip_special_tokens=skip_special_tokens,
            grammar=grammar,
            ignore_eos=req.ignore_eos,
            eos_text=eos_text,
        )
        scheduler.submit(self.job)
        scheduler.metrics.count("prompt_tokens_total", len(prompt_ids))
        self.metrics = scheduler.metrics

    def _emit(self, event: Chunk | Finished | Failed) -> None:
        """Called from the scheduler thread."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            self.job.cancelled = True

    async def events(self, request: Request | None = None) -> AsyncIterator[Chunk | Finished]:
        """The job's chunks and finishes; a :class:`Failed` raises a :class:`ServeError` (500, or 503
        when the server is shutting down). With ``request``, a disconnected client raises
        :class:`ClientGone`."""
        finished = 0
        watcher = asyncio.create_task(self._watch(request)) if request is not None else None
        try:
            while finished < self.n:
                event = await self.queue.get()
                if event is _GONE:
                    raise ClientGone
                if isinstance(event, Failed):
                    raise ServeError(event.message, status=event.status, type="server_error", code=event.code)
                if isinstance(event, Chunk) and self.first_token_at is None:
                    self.first_token_at = time.monotonic()
                    self.metrics.observe("time_to_first_token_seconds", self.first_token_at - self.started)
                finished += isinstance(event, Finished)
                yield event
            self.metrics.observe("request_latency_seconds", time.monotonic() - self.started)
        finally:
            if watcher is not None:
                watcher.cancel()
            if finished < self.n:
                self.job.cancelled = True

    async def _watch(self, request: Request) -> None:
        """Wait for the client's disconnect (its request body was read: the next message the server
        has for this request is ``http.disconnect``), then cancel the job and wake :meth:`events`."""
        while (await request.receive())["type"] != "http.disconnect":
            pass
        self.job.cancelled = True
        self.queue.put_nowait(_GONE)
