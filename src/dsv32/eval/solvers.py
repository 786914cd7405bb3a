"""Who answers: the benchmark's reference, a local model, or an OpenAI-compatible endpoint.

A solver answers single-turn problems in chunks (:meth:`complete`: one assistant message per
``(problem, sample)``) and gives episodic benchmarks an agent backend (:meth:`episode_backend`).

- :class:`ReferenceSolver`: the benchmark's own solution (``reference`` / a ``ScriptedBackend`` over
  ``reference_replies``) — the harness's self-check, which must score 100 %.
- :class:`LocalSolver`: a model loaded in this process (``dsv32.engine.models.load_model``). Single-turn
  problems are generated in batches with :func:`dsv32.engine.generate` (the prompt and the parse of
  the reply are the agent's local formats: the V3.2 encoding, or the model's chat template with
  ``<tool_call>`` tools); episodes use :class:`dsv32.agent.LocalBackend`. One model, one thread.
- :class:`EndpointSolver`: :class:`dsv32.agent.OpenAIBackend` for every request, ``concurrency`` at a
  time (a thread pool; each thread and each episode its own backend object, as the token estimator is
  per object, all over one HTTP client and its connection pool).
"""

from __future__ import annotations

import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from dsv32.eval.errors import EvalError
from dsv32.eval.settings import RunSettings
from dsv32.eval.types import Benchmark, Problem


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


class EndpointSolver:
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
        self._local = threading.local()

    def _backend(self) -> Any:
        if getattr(self._local, "backend", None) is None:
            self._local.backend = self.episode_backend(None)
        return self._local.backend

    def episode_backend(self, problem: Problem | None) -> Any:
        from dsv32.agent import OpenAIBackend

        return OpenAIBackend(
            self.base_url, self.model, self.api_key, client=self.client, max_retries=self.max_retries
        )

    def complete(self, items: list[tuple[Problem, int]], settings: RunSettings) -> list[Generated]:
        from dsv32.agent import BackendError

        def one(item: tuple[Problem, int]) -> Generated:
            problem, _ = item
            try:
                out = self._backend().complete(
                    problem.messages, problem.tools, thinking=settings.thinking, sampling=settings.sampling()
                )
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

        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(one, items))


class LocalSolver:
    chunk_size = 8

    def __init__(self, name: str, batch_size: int = 8, device: str = "auto") -> None:
        from dsv32.agent import LocalBackend
        from dsv32.engine.models import load_model

        loaded = load_model(name, device=device)
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
