"""Who answers: the benchmark's reference, a local model, or an OpenAI-compatible endpoint.

A solver answers single-turn problems in chunks (:meth:`complete`: one assistant message per
``(problem, sample)``) and gives episodic benchmarks an agent backend (:meth:`episode_backend`).

- :class:`ReferenceSolver`: the benchmark's own solution (``reference`` / a ``ScriptedBackend`` over
  ``reference_replies``) — the harness's self-check, which must score 100 %.
- :class:`LocalSolver`: a model loaded in this process (``dsv32.engine.models.load_model``, in the
  run's ``dtype``). Single-turn problems are generated in batches with :func:`dsv32.engine.generate`
  (the prompt and the parse of the reply are the agent's local formats: the V3.2 encoding, or the
  model's chat template with ``<tool_call>`` tools); episodes use :class:`dsv32.agent.LocalBackend`.
  One model, one thread.
- :class:`EndpointSolver`: :class:`dsv32.agent.OpenAIBackend` for every request, ``concurrency`` at a
  time (a thread pool; each thread and each episode its own backend object, as the token estimator is
  per object, all over one HTTP client and its connection pool); ``max_tokens`` fitted to the context
  length the endpoint reports, and each reply handed on as it arrives (:meth:`EndpointSolver.stream`).
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from dsv32.eval.errors import EvalError
from dsv32.eval.settings import RunSettings
from dsv32.eval.types import Benchmark, Problem

log = logging.getLogger(__name__)


@dataclass
class Generated:
    """One reply to a single-turn problem."""

    message: dict
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    finish_reason: str | None = None
    problems: list = field(default_factory=list)
    error: str | None = None


class ReferenceSolver:
    chunk_size = 64

    def __init__(self, bench: Benchmark) -> None:
        self.bench = bench

    def complete(self, items: list[tuple[Problem, int]], settings: RunSettings) -> list[Generated]:
        return [Generated(self.bench.reference(p), finish_reason="stop") for p, _ in items]

    def episode_backend(self, problem: Problem) -> Any:
        from dsv32.agent import ScriptedBackend

        return ScriptedBackend(self.bench.reference_replies(problem))


def endpoint_window(client: Any, model: str) -> int | None:
    """The context length ``GET /v1/models`` reports for ``model`` (``max_model_len``, as vLLM, SGLang
    and ``dsv32 serve`` give it), else None (the endpoint does not say, or cannot be asked)."""
    try:  # one attempt, on the client's own connection pool
        body = client.get("/models", cast_to=object, options={"max_retries": 0, "timeout": 15.0})
    except Exception as err:  # any failure to ask: the window stays unknown, the requests go as set
        log.debug("GET /models failed: %s", err)
        return None
    cards = body.get("data") if isinstance(body, dict) else None
    for card in cards if isinstance(cards, list) else []:
        if isinstance(card, dict) and card.get("id") == model:
            value = card.get("max_model_len")
            return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
    return None


class EndpointSolver:
    """Requests to an OpenAI-compatible endpoint. ``window``: the endpoint's context length for the
    model (:func:`endpoint_window`); when known, a ``max_tokens`` as large as the window (the paper's
    128K default) is fitted to each request as the window minus the prompt (the prompt counted by the
    backend's estimator, which errs high, and after a refusal that gives the prompt's size, that size:
    the request is sent once more), as the agent loop fits it for episodes. Replies stream back one
    by one (:meth:`stream`). ``advice``: what to change for refusals that a rerun would meet again."""

    def __init__(
        self,
        base_url: str,
        model: str,
        concurrency: int = 1,
        api_key: str | None = None,
        *,
        timeout_s: float = 600.0,
        max_retries: int = 5,
    ) -> None:
        if not base_url or not model:
            raise EvalError("--backend openai needs --base-url URL and --model NAME")
        from dsv32.agent import OpenAIBackend

        self.base_url, self.model, self.api_key = base_url, model, api_key
        self.concurrency = concurrency
        self.max_retries = max_retries
        self.chunk_size = max(4 * concurrency, 8)
        # one thread-safe client, shared by the backends
        self.client = OpenAIBackend(
            base_url, model, api_key, timeout_s=timeout_s, max_retries=max_retries
        ).client
        self.window = endpoint_window(self.client, model)
        self.advice: set[str] = set()
        self._local = threading.local()

    def budget_note(self, max_tokens: int) -> str | None:
        """What the run does with ``max_tokens`` at this endpoint, when it changes it."""
        if self.window is None or max_tokens < self.window:
            return None
        return (
            f"max_tokens: {self.base_url} reports a {self.window}-token context for {self.model} "
            f"(max_model_len), less than max_tokens {max_tokens}; each request gets what its prompt leaves "
            "of that window"
        )

    def _backend(self) -> Any:
        if getattr(self._local, "backend", None) is None:
            self._local.backend = self.episode_backend(None)
        return self._local.backend

    def episode_backend(self, problem: Problem | None) -> Any:
        from dsv32.agent import OpenAIBackend

        return OpenAIBackend(
            self.base_url, self.model, self.api_key, client=self.client, max_retries=self.max_retries
        )

    def _refused(self, sampling: dict, fitted: bool, prompt_tokens: int | None, err: Exception) -> str:
        """The error of a request refused for its length, and what to change (kept in ``advice``)."""
        budget = sampling.get("max_tokens")
        if fitted and (budget == 1 or (prompt_tokens or 0) >= self.window):  # the prompt alone is too long
            self.advice.add(
                f"serve {self.model} with a longer context (vLLM's or dsv32 serve's --max-model-len) "
                "or leave these problems out (--limit, --subset)"
            )
            size = f"{prompt_tokens} tokens" if prompt_tokens else "over the window"
            return f"the prompt ({size}) does not fit {self.model}'s {self.window}-token context: {err}"
        where = (
            f"the {self.window}-token context"
            if self.window
            else f"the model's context, which {self.base_url} does not report in /v1/models"
        )
        self.advice.add(f"pass a smaller --max-tokens (prompt + max_tokens must fit {where})")
        return f"refused for its length with max_tokens {budget}: {err}"

    def _one(self, problem: Problem, settings: RunSettings) -> Generated:
        from dsv32.agent import BackendError, ContextLengthError

        backend, sampling = self._backend(), settings.sampling()
        fitted = self.window is not None and sampling["max_tokens"] >= self.window
        for attempt in range(2):
            if fitted:
                prompt = backend.count_tokens(problem.messages, problem.tools, thinking=settings.thinking)
                sampling = {**sampling, "max_tokens": max(1, self.window - prompt)}
            try:
                out = backend.complete(
                    problem.messages, problem.tools, thinking=settings.thinking, sampling=sampling
                )
                break
            except ContextLengthError as err:
                # the estimator now holds the size the endpoint gave: one more try fits it exactly
                if not (fitted and attempt == 0 and err.prompt_tokens and err.prompt_tokens < self.window):
                    why = self._refused(sampling, fitted, err.prompt_tokens, err)
                    return Generated({"role": "assistant", "content": ""}, error=why)
            except BackendError as err:
                return Generated({"role": "assistant", "content": ""}, error=str(err))
        usage = out.usage
        return Generated(
            out.message,
            usage.prompt_tokens,
            usage.completion_tokens,
            out.latency_s,
            out.finish_reason,
            out.problems,
        )

    def stream(
        self, items: list[tuple[Problem, int]], settings: RunSettings
    ) -> Iterator[tuple[Any, Generated]]:
        """``(item, reply)`` for every item, each as soon as it is answered (``concurrency`` at a time)."""
        pending = iter(items)
        with ThreadPoolExecutor(self.concurrency) as pool:
            running = {
                pool.submit(self._one, item[0], settings): item for item in islice(pending, self.concurrency)
            }
            while running:
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    item = running.pop(future)
                    following = next(pending, None)
                    if following is not None:
                        running[pool.submit(self._one, following[0], settings)] = following
                    yield item, future.result()

    def complete(self, items: list[tuple[Problem, int]], settings: RunSettings) -> list[Generated]:
        replies = dict((id(item), gen) for item, gen in self.stream(items, settings))
        return [replies[id(item)] for item in items]


class LocalSolver:
    chunk_size = 8

    def __init__(self, name: str, batch_size: int = 8, device: str = "auto", dtype: str = "float32") -> None:
        from dsv32.agent import LocalBackend
        from dsv32.engine.models import load_model

        loaded = load_model(name, device=device, dtype=dtype)
        log.info("%s loaded in %s", name, dtype)
        self.name = name
        self.chunk_size = batch_size
        self.backend = LocalBackend(loaded.model, loaded.tokenizer)
        self.window = self.backend.window  # each episode reply is capped to it by the backend

    def episode_backend(self, problem: Problem) -> Any:
        return self.backend

    def complete(self, items: list[tuple[Problem, int]], settings: RunSettings) -> list[Generated]:
        import torch

        from dsv32.engine import generate

        fmt, model = self.backend.format, self.backend.model
        prompts = [list(fmt.prompt(p.messages, p.tools, settings.thinking).ids) for p, _ in items]
        longest = max(len(ids) for ids in prompts)
        budget = (
            settings.max_tokens if self.window is None else min(settings.max_tokens, self.window - longest)
        )
        if budget < 1:
            raise EvalError(
                f"a prompt of {longest} tokens leaves no room in {self.name}'s {self.window}-token window"
            )
        generator = torch.Generator(device=self.backend.session.device)
        key = "|".join(f"{p.id}#{j}" for p, j in items)
        generator.manual_seed(settings.seed * 1_000_003 + zlib.crc32(key.encode()))
        start = time.perf_counter()
        out = generate(
            model,
            prompts,
            max_new_tokens=budget,
            temperature=settings.temperature,
            top_p=settings.top_p,
            eos_token_id=fmt.stop_ids,
            generator=generator,
        )
        latency = (time.perf_counter() - start) / len(items)
        results = []
        for row, ids in enumerate(prompts):
            length = int(out.lengths[row])
            tokens = [t for t in out.tokens[row, :length].tolist() if t not in fmt.stop_ids]
            message, problems = fmt.parse(fmt.decode(tokens), settings.thinking)
            stopped = length > len(tokens)
            finish = "stop" if stopped else "length"
            results.append(Generated(message, len(ids), length, latency, finish, problems))
        return results
