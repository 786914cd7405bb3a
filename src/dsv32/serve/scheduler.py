"""Continuous batching: one thread owns the model and decodes every running request together.

Each loop iteration:

1. **admit** waiting jobs in arrival order while their ``n`` rows fit into ``max_batch``: their
   prompts are prefilled together (one left-padded forward for up to :data:`PREFILL_TOKENS` padded
   tokens; a job's ``n`` rows share its prompt's) and their rows join the running batch, see
   :class:`~dsv32.engine.batch.RunningBatch`;
2. **sample** one token for every row, each with its own parameters and seeded generator (and, for
   a request with a grammar, only among the tokens its :class:`~dsv32.engine.constraint.Constraint`
   allows), decode it, check EOS / stop strings / ``max_tokens``, and send the row's new text (and
   log-probs) to its job;
3. **remove** finished and cancelled rows — their slots are free for the next iteration's admission —
   and **step** the rest: one batched forward for all rows.

Jobs arrive from the server's event loop (:meth:`Scheduler.submit`, which answers 503 when
``max_queue`` jobs are already waiting) and get their events through ``job.emit``, a callable that
is safe to call from this thread. :meth:`Scheduler.pause` and :meth:`Scheduler.resume` stop and restart
generation for the RL routes (abort, let finish, or hold what runs). Setting ``job.cancelled`` (a client went away) frees the job's
rows at the next iteration. A row that cannot be sampled fails its own job; a request that cannot join
the batch (its prefill, or the checks that its cache can be merged, fail) fails alone; a failure
inside a step or a merge is reported to every job in the batch, which is reset. The thread keeps
serving.

With a prefix cache (``prefix_cache_bytes > 0``, a :class:`~dsv32.engine.prefix.PrefixStore`), a
prompt's prefill runs only what the cache does not hold of it and keeps the prompt's entries, and a
row that finishes keeps its prompt and reply, so the ``n`` samples of a group, repeated system prompts
and every turn of a conversation share their prefixes. The cache is bounded in bytes (least recently
used rows evicted), cleared whenever the weights change, and reported in ``/metrics``
(``prefix_cache_queries_total`` and ``prefix_cache_hits_total`` in tokens, their ratio, its size).

The batch records no DSA indexer selections (Keep Indexing): a request for them
(``return_indexer_topk``) is refused with a 400 before it becomes a job
(:class:`~dsv32.serve.protocol.SamplingFields`); ``POST /inference/v1/generate`` records them.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from dsv32.engine.batch import RunningBatch, check_batchable, sample_rows
from dsv32.engine.constraint import Grammar, GrammarError
from dsv32.engine.prefix import PrefixStore
from dsv32.engine.sampling import SamplingParams
from dsv32.engine.tokenbytes import TokenBytes
from dsv32.serve.detok import IncrementalText
from dsv32.serve.errors import ServeError, queue_full, shutting_down
from dsv32.serve.metrics import Metrics
from dsv32.serve.runtime import ServedModel

logger = logging.getLogger(__name__)

PAUSE_MODES = ("abort", "wait", "keep")
#: The most padded prompt tokens prefilled in one forward when several requests are admitted at once.
PREFILL_TOKENS = 8192


@dataclass
class Chunk:
    """New text of choice ``index`` (possibly empty) and the log-prob entries of its new tokens."""

    index: int
    text: str
    logprobs: list[dict[str, Any]] | None = None


@dataclass
class Finished:
    index: int
    reason: str  # "stop" or "length"
    completion_tokens: int


@dataclass
class Failed:
    message: str
    status: int = 500
    code: str = "generation_failed"


@dataclass
class Job:
    """One request: ``n`` completions of one prompt."""

    prompt_ids: list[int]
    max_tokens: int
    params: SamplingParams
    emit: Callable[[Chunk | Finished | Failed], None]
    n: int = 1
    seed: int | None = None
    stops: list[str] = field(default_factory=list)
    top_logprobs: int | None = None  # None: no log-probs
    skip_special_tokens: bool = True
    grammar: Grammar | None = None  # what every choice must be (each row gets its own constraint)
    ignore_eos: bool = False  # decode on past end tokens until max_tokens (vLLM's ignore_eos)
    eos_text: bool = True  # whether the end token that ends a row is decoded into its text
    cancelled: bool = False
    submitted: float = field(default_factory=time.monotonic)


class _Row:
    def __init__(self, job: Job, index: int, tokenizer, device: torch.device) -> None:
        self.job = job
        self.index = index
        self.tokens: list[int] = []  # sampled so far
        self.text = IncrementalText(tokenizer, skip_special_tokens=job.skip_special_tokens, stops=job.stops)
        self.generator = None
        if not job.params.greedy:
            seed = (
                (job.seed + index) % 2**64 if job.seed is not None else random.SystemRandom().randrange(2**62)
            )
            self.generator = torch.Generator(device=device).manual_seed(seed)
        self.constraint = job.grammar.constraint() if job.grammar is not None else None


def _fail(jobs: list[Job], message: str) -> None:
    """One :class:`Failed` to each job (a job with ``n`` rows is listed once per row)."""
    for job in {id(j): j for j in jobs}.values():
        job.emit(Failed(message))


class Scheduler:
    """The batching loop over ``served``'s model (see the module docstring)."""

    def __init__(
        self,
        served: ServedModel,
        max_batch: int = 8,
        max_queue: int = 64,
        metrics: Metrics | None = None,
        prefix_cache_bytes: int = 0,
    ):
        self.served = served
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.metrics = metrics or Metrics()
        if max_batch > 1:  # a cache that cannot be merged is refused now, not at the second request
            check_batchable(served.model)
        self.batch = RunningBatch(served.model)
        # the prefix cache: used under model_lock only (this thread, the RL routes' generate)
        self.prefix = PrefixStore(prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        if self.prefix is not None:
            self.metrics.read_from(self._prefix_metrics)
        self.rows: list[_Row] = []
        self.waiting: deque[Job] = deque()
        self.cond = threading.Condition()
        self.stopping = False
        self.thread: threading.Thread | None = None
        self.eos = set(served.eos_ids)
        self.token_bytes = TokenBytes(served.tokenizer)
        # The loop runs the model under model_lock (the RL routes take it to generate or swap weights
        # between steps); admitting / stepping False hold queued requests / running rows (a paused server).
        self.model_lock = threading.Lock()
        self.admitting = True
        self.stepping = True

    # ------------------------------------------------------------------ event-loop side
    def submit(self, job: Job) -> None:
        with self.cond:
            if self.stopping:
                raise shutting_down()
            if len(self.waiting) >= self.max_queue:
                raise queue_full(self.max_queue)
            self.waiting.append(job)
            self.cond.notify()

    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name="dsv32-serve-scheduler", daemon=True)
        self.thread.start()

    def close(self) -> None:
        """Stop serving without waiting: after the current step every running and waiting job gets a
        503 :class:`Failed` (the server is shutting down), so their responses end at once."""
        with self.cond:
            self.stopping = True
            self.cond.notify()

    def stop(self) -> None:
        self.close()
        if self.thread is not None:
            self.thread.join(timeout=30)

    # ------------------------------------------------------------------ pausing (the RL routes)
    def pause(self, mode: str, timeout: float) -> int:
        """Stop generating; returns once no model step runs, with the number of jobs aborted.

        - ``abort``: every running and waiting job fails (the batch is emptied);
        - ``wait``: no job is admitted, the running rows finish — within ``timeout`` seconds, else
          generation resumes and a 503 :class:`ServeError` says how many rows still run;
        - ``keep``: running rows and waiting jobs are held where they are until :meth:`resume`.
        """
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode {mode!r}; known: {list(PAUSE_MODES)}")
        with self.cond:
            self.admitting = False
            if mode != "wait":
                self.stepping = False
        if mode == "wait":
            deadline = time.monotonic() + timeout
            while self.rows and time.monotonic() < deadline:
                time.sleep(0.01)
            if running := len(self.rows):
                self.resume()
                raise ServeError(
                    f"pause(mode=wait): {running} running rows did not finish within {timeout:g} s",
                    status=503,
                    type="server_error",
                )
            with self.cond:
                self.stepping = False
        aborted = 0
        with self.model_lock:  # the step in progress (or an RL generate) is over
            if mode == "abort":
                with self.cond:
                    jobs = {id(r.job): r.job for r in self.rows} | {id(j): j for j in self.waiting}
                    self.waiting.clear()
                for job in jobs.values():
                    job.emit(Failed("the request was aborted: the server was paused (mode=abort)"))
                aborted = len(jobs)
                self.rows = []
                self.batch = RunningBatch(self.served.model)
        return aborted

    def resume(self) -> None:
        """Admit and step again (after :meth:`pause`); held rows go on where they stopped."""
        with self.cond:
            self.admitting = self.stepping = True
            self.cond.notify()

    # ------------------------------------------------------------------ the thread
    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.stopping and not (
                    (self.rows and self.stepping) or (self.waiting and self.admitting)
                ):
                    self.cond.wait()
                if self.stopping:
                    break
            try:
                with self.model_lock:
                    if self.admitting:
                        self._admit()
                    if self.rows and self.stepping:
                        self._step()
            except Exception as err:  # the server outlives a failed step; its jobs get the error
                logger.exception("generation step failed")
                _fail([r.job for r in self.rows], f"generation failed: {type(err).__name__}: {err}")
                self.rows = []
                self.batch = RunningBatch(self.served.model)
            self.metrics.set_gauges(running_rows=len(self.rows), waiting_requests=len(self.waiting))
        with self.cond:
            jobs = [r.job for r in self.rows] + list(self.waiting)
            self.rows, self.waiting = [], deque()
        for job in {id(j): j for j in jobs}.values():
            job.emit(Failed(shutting_down().message, status=503, code="shutting_down"))
        self.metrics.set_gauges(running_rows=0, waiting_requests=0)

    def _prefix_metrics(self) -> dict[str, float]:
        """The prefix cache's counters and size, as ``/metrics`` shows them (read from any thread)."""
        store = self.prefix
        return {
            "prefix_cache_queries_total": store.query_tokens,
            "prefix_cache_hits_total": store.hit_tokens,
            "prefix_cache_evictions_total": store.evicted,
            "prefix_cache_bytes": store.nbytes(),
            "prefix_cache_rows": len(store.rows),
            "prefix_cache_hit_rate": store.hit_rate,
        }

    def clear_prefix(self) -> None:
        """Forget the prefix cache's entries (call with ``model_lock`` held, when the weights change)."""
        if self.prefix is not None:
            self.prefix.clear()

    def _admit(self) -> None:
        """Admit waiting jobs while their rows fit; their prompts are prefilled together, in groups of
        at most :data:`PREFILL_TOKENS` padded tokens."""
        jobs: list[Job] = []
        free = self.max_batch - len(self.rows)
        with self.cond:
            while self.waiting and self.waiting[0].n <= free:
                job = self.waiting.popleft()
                if job.cancelled:
                    continue
                jobs.append(job)
                free -= job.n
        now = time.monotonic()
        for job in jobs:
            self.metrics.observe("queue_time_seconds", now - job.submitted)
        group: list[Job] = []
        longest = 0  # the group's longest prompt: a left-padded forward runs every row at its length
        for job in jobs:
            longest = max(longest, len(job.prompt_ids))
            if group and longest * (len(group) + 1) > PREFILL_TOKENS:
                self._join(group)
                group, longest = [], len(job.prompt_ids)
            group.append(job)
        if group:
            self._join(group)

    def _join(self, jobs: list[Job]) -> None:
        """Prefill ``jobs`` together and add their rows; when that fails, each job alone, so that
        what only one job needs (its rows, its prefill, the merge checks) fails only that job."""
        if len(jobs) > 1:
            try:
                rows = [
                    _Row(job, i, self.served.tokenizer, self.batch.device)
                    for job in jobs
                    for i in range(job.n)
                ]
                prefilled = self.batch.prefill_many(
                    [j.prompt_ids for j in jobs],
                    [j.n for j in jobs],
                    [j.max_tokens for j in jobs],
                    self.prefix,
                )
            except Exception:
                logger.warning("prefilling %d requests together failed; each is tried alone", len(jobs))
            else:
                self.rows += rows  # the rows join before the merge: a failing merge fails them with the batch
                self.batch.join(prefilled)
                return
        for job in jobs:
            try:
                rows = [_Row(job, i, self.served.tokenizer, self.batch.device) for i in range(job.n)]
                prefilled = self.batch.prefill(job.prompt_ids, job.n, job.max_tokens, self.prefix)
            except Exception as err:
                logger.exception("a request could not join the batch")
                _fail([job], f"generation failed: {type(err).__name__}: {err}")
                continue
            self.rows += rows
            self.batch.join(prefilled)

    def _step(self) -> None:
        rows = self.rows
        params = [r.job.params for r in rows]
        want_logprobs = any(r.job.top_logprobs is not None for r in rows)
        errors: dict[int, Exception] = {}
        generators = [r.generator for r in rows]
        allowed = self._allowed(rows, errors)
        tokens, logprobs = sample_rows(self.batch.logits, params, generators, want_logprobs, errors, allowed)
        self.metrics.observe("batch_size", len(rows))
        failed: set[int] = set()  # a row that could not be sampled fails its own job only
        for i, err in errors.items():
            job = rows[i].job
            if id(job) not in failed:
                logger.error("sampling failed for one request", exc_info=err)
                job.emit(Failed(f"generation failed: {type(err).__name__}: {err}"))
                failed.add(id(job))
        keep: list[int] = []
        done: list[int] = []  # rows that finished at this token
        advanced = 0
        for i, row in enumerate(rows):
            if row.job.cancelled or id(row.job) in failed:
                continue
            advanced += 1
            if row.constraint is not None:
                try:
                    row.constraint.advance(tokens[i])
                except GrammarError as err:
                    row.job.emit(Failed(f"generation failed: {err}"))
                    failed.add(id(row.job))
                    continue
            if self._advance(row, tokens[i], None if logprobs is None else logprobs[i]):
                keep.append(i)
            else:
                done.append(i)
        self.metrics.count("generation_tokens_total", advanced)
        if self.prefix is not None:  # finished replies: the next turn's prompt begins with them
            done = [i for i in done if len(rows[i].tokens) > 1]  # the others hold their prompt only
            try:
                self.batch.keep(
                    self.prefix, done, [rows[i].job.prompt_ids + rows[i].tokens[:-1] for i in done]
                )
            except Exception:  # the cache is an optimization: a row it cannot keep costs nothing else
                logger.exception("finished rows could not be kept in the prefix cache")
        self.rows = [rows[i] for i in keep]
        self.batch.remove(keep)
        if keep:
            self.batch.step([tokens[i] for i in keep])

    def _allowed(self, rows: list[_Row], errors: dict[int, Exception]) -> torch.Tensor | None:
        """``[B, V]``: the tokens each row's constraint allows (None when no row has one); a row whose
        constraint fails gets its error in ``errors`` (and its job fails alone)."""
        V = self.batch.logits.shape[-1]
        masks: list[torch.Tensor | None] = []
        for i, row in enumerate(rows):
            mask = None
            if row.constraint is not None:
                try:
                    mask = row.constraint.allowed()[:V]
                except GrammarError as err:
                    errors[i] = err
            masks.append(mask)
        if all(m is None for m in masks):
            return None
        free = torch.ones(V, dtype=torch.bool)
        return torch.stack([free if m is None else m for m in masks]).to(self.batch.device)

    def _advance(self, row: _Row, token: int, logprobs: torch.Tensor | None) -> bool:
        """Record ``token`` for ``row``; send its events; True while the row goes on."""
        job = row.job
        row.tokens.append(token)
        ends = token in self.eos and not job.ignore_eos
        piece = row.text.push(token) if job.eos_text or not ends else ""
        reason = None
        if row.text.stopped or ends:
            reason = "stop"
        elif len(row.tokens) >= job.max_tokens:
            reason = "length"
        if reason is not None:
            piece += row.text.flush()
        entries = (
            [self._logprob_entry(token, logprobs, job.top_logprobs)] if job.top_logprobs is not None else None
        )
        job.emit(Chunk(row.index, piece, entries))
        if reason is not None:
            job.emit(Finished(row.index, reason, len(row.tokens)))
            return False
        return True

    def _logprob_entry(self, token: int, logprobs: torch.Tensor, top: int) -> dict[str, Any]:
        """OpenAI's ``{"token", "logprob", "bytes", "top_logprobs"}`` of the model's raw distribution."""
        entry = self._token_logprob(token, float(logprobs[token]))
        values, ids = logprobs.topk(top) if top else (torch.empty(0), torch.empty(0, dtype=torch.long))
        entry["top_logprobs"] = [self._token_logprob(t, v) for v, t in zip(values.tolist(), ids.tolist())]
        return entry

    def _token_logprob(self, token: int, logprob: float) -> dict[str, Any]:
        """``token`` is its text; a token holding part of a character (its bytes no whole UTF-8) is
        written as OpenAI writes it, the bytes escaped (``"\\xf0\\x9f"``), not as U+FFFD."""
        text = self.served.tokenizer.decode([token], skip_special_tokens=False)
        raw = self.token_bytes(token)
        if raw is not None and "\ufffd" in text:
            text = bytes(raw).decode("utf-8", errors="backslashreplace")
        return {"token": text, "logprob": max(logprob, -9999.0), "bytes": raw}
