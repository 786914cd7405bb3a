"""A model loaded in this process: a native V3.2 checkpoint or a Hugging Face causal LM, through
:mod:`dsv32.engine`.

Prompts: the V3.2 encoding when the tokenizer knows the V3.2 special tokens, else the model's own chat
template (``format="auto"``; see :mod:`dsv32.agent.backends.formats`), whose tool calls are written
and read in the format ``tool_parser`` names (``hermes``, ``llama3_json``, ``mistral``; by default
the template family's) — as ``dsv32 serve --tool-call-parser`` does. Generation runs in one
:class:`~dsv32.engine.session.Session` whose KV cache lives across calls, so an episode prefills only
what each step adds (the new tool results and the re-rendered last reply), not the whole prompt.
``last_prompt`` / ``last_prompt_ids`` hold the prompt of the latest call; ``session.prefilled_tokens``
counts what was prefilled over all calls, and each call's usage reports the reused tokens as
``cached_tokens``. A reply is capped to the room the prompt leaves in the model's window
(``max_position_embeddings``, as ``window``); a prompt that fills it raises
:class:`~dsv32.agent.errors.ContextLengthError` (the loop manages the context or stops with
``"context"``).

Sampling defaults (temperature 0.6, top-p 0.95, 1024 tokens) can be changed per backend or per call,
with the names every backend takes (:data:`~dsv32.agent.backends.base.SAMPLING_KEYS`):
``temperature``, ``top_p``, ``top_k``, ``max_tokens``, ``seed`` (``max_new_tokens``, the engine's
name, is an alias of ``max_tokens``; giving both with different values is an error). The
backend's ``seed`` starts one random stream that every call continues (a run repeats, two calls on
the same prompt differ); a call's ``seed`` gives that call a stream of its own, as an endpoint's
per-request seed does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from dsv32.agent.backends.base import SAMPLING_KEYS, Completion, Delta, Usage, one_budget
from dsv32.agent.backends.formats import TemplateFormat, V32Format
from dsv32.agent.errors import AgentError, ContextLengthError


class _Streamer:
    """Turns generated tokens into ``on_delta("reasoning" | "content", text)`` calls: reasoning up to
    the format's end-of-thinking marker (thinking mode), content up to its tool-call marker."""

    def __init__(self, fmt: Any, thinking: bool, on_delta: Delta) -> None:
        self.fmt, self.on_delta = fmt, on_delta
        self.tokens: list[int] = []
        # V3.2: the prompt opened the think block; templates: the reply opens one or it is content
        self.kind = "start" if fmt.think_start else ("reasoning" if thinking else "content")
        self.sent = 0  # characters of the decoded text already passed on (or skipped)
        self.hold = max(len(fmt.think_end), len(fmt.calls_start))
        self.done = False

    def _opening(self, text: str) -> bool:
        """Decide (templates) whether the reply opens with a think block; False while undecided."""
        head = text.lstrip()
        if head.startswith(self.fmt.think_start):
            self.kind, self.sent = "reasoning", text.index(self.fmt.think_start) + len(self.fmt.think_start)
        elif self.fmt.think_start.startswith(head):
            return False
        else:
            self.kind = "content"
        return True

    def __call__(self, token: int) -> None:
        if self.done:
            return
        if token not in self.fmt.stop_ids:
            self.tokens.append(token)
        text = self.fmt.decode(self.tokens)
        if self.kind == "start" and not self._opening(text):
            return
        while not self.done:
            marker = self.fmt.think_end if self.kind == "reasoning" else self.fmt.calls_start
            found = text.find(marker, self.sent)
            if found < 0:
                break
            self._send(text[self.sent : found])
            self.sent = found + len(marker)
            self.done = self.kind == "content"
            self.kind = "content"
        if not self.done:
            safe = max(self.sent, len(text) - self.hold)
            self._send(text[self.sent : safe])
            self.sent = safe

    def flush(self) -> None:
        if self.kind == "start":
            self.kind = "content"
        if not self.done:
            self._send(self.fmt.decode(self.tokens)[self.sent :])

    def _send(self, text: str) -> None:
        if text:
            self.on_delta(self.kind, text)


class LocalBackend:
    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        format: str = "auto",
        max_tokens: int | None = None,
        temperature: float = 0.6,
        top_p: float = 0.95,
        top_k: int = 0,
        seed: int | None = None,
        reuse_cache: bool = True,
        template_kwargs: dict | None = None,
        tool_parser: str | None = None,
        max_new_tokens: int | None = None,
    ) -> None:
        from dsv32.chat import missing_special_tokens
        from dsv32.engine.session import Session

        if tokenizer is None:
            raise AgentError("a local backend needs the model's tokenizer (save one beside its weights)")
        if format == "auto":
            v32 = hasattr(tokenizer, "get_added_vocab") and not missing_special_tokens(tokenizer)
            format = "v32" if v32 else "template"
        if format == "v32":
            self.format: V32Format | TemplateFormat = V32Format(tokenizer)
        elif format == "template":
            self.format = TemplateFormat(tokenizer, _eos_ids(model, tokenizer), template_kwargs, tool_parser)
        else:
            raise AgentError(f"format must be 'auto', 'v32' or 'template', got {format!r}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.session = Session(model, reuse=reuse_cache)
        #: the model's context window in tokens (None when its config does not say)
        self.window = int(getattr(getattr(model, "config", None), "max_position_embeddings", 0) or 0) or None
        self.defaults = {
            "temperature": temperature,
            "top_p": top_p,
            "top_k": top_k,
            "max_tokens": one_budget({"max_tokens": max_tokens, "max_new_tokens": max_new_tokens}) or 1024,
        }
        self.seed = seed
        self.generator: Any = None
        self.last_prompt = ""
        self.last_prompt_ids: list[int] = []

    @classmethod
    def load(cls, name: str, *, device: str = "auto", tokenizer: Any = None, **options: Any) -> LocalBackend:
        """A backend over :func:`dsv32.engine.models.load_model` ``(name)``: ``smollm2``, a native V3.2
        checkpoint, a Hugging Face model directory."""
        from dsv32.engine.models import load_model

        loaded = load_model(name, device=device)
        return cls(loaded.model, tokenizer if tokenizer is not None else loaded.tokenizer, **options)

    def _generator(self) -> Any:
        """The backend's own random stream (``seed``), made at its first call and advanced by every
        call after it, so that calls on the same prompt (the threads of ``parallel_fewest_step``)
        sample differently while a run from the same seed repeats; None without a seed."""
        import torch

        if self.seed is not None and self.generator is None:
            self.generator = torch.Generator(device=self.session.device).manual_seed(int(self.seed))
        return self.generator

    def reply_budget(self, sampling: dict | None = None) -> int:
        """The most tokens a reply with these settings may have (``max_tokens``)."""
        return one_budget(sampling or {}) or self.defaults["max_tokens"]

    def count_tokens(self, messages: Sequence[dict], tools: Sequence[dict], *, thinking: bool = True) -> int:
        return len(self.format.prompt(messages, tools, thinking).ids)

    def complete(
        self,
        messages: Sequence[dict],
        tools: Sequence[dict],
        *,
        thinking: bool = True,
        sampling: dict | None = None,
        on_delta: Delta | None = None,
    ) -> Completion:
        import torch

        from dsv32.engine.sampling import SamplingParams

        settings = {**self.defaults, **(sampling or {})}
        unknown = set(settings) - {"temperature", "top_p", "top_k", "max_tokens", "max_new_tokens", "seed"}
        if unknown:
            raise AgentError(
                f"the local backend does not know the sampling setting(s) {sorted(unknown)}; it takes "
                f"{list(SAMPLING_KEYS)}"
            )
        start = time.perf_counter()
        prompt = self.format.prompt(messages, tools, thinking)
        self.last_prompt, self.last_prompt_ids = prompt.text, prompt.ids
        params = SamplingParams(settings["temperature"], settings["top_p"], settings["top_k"])
        if settings.get("seed") is not None:  # a call's own seed, like an endpoint request's
            generator = torch.Generator(device=self.session.device).manual_seed(int(settings["seed"]))
        else:
            generator = self._generator()
        max_new = self.reply_budget(sampling)
        if self.window is not None:
            room = self.window - len(prompt.ids)
            if room < 1:
                raise ContextLengthError(
                    f"the conversation fills the model's {self.window}-token window", len(prompt.ids)
                )
            max_new = min(max_new, room)
        streamer = _Streamer(self.format, thinking, on_delta) if on_delta is not None else None
        out = self.session.generate(
            prompt.ids,
            max_new_tokens=max_new,
            sampling=params,
            stop_ids=self.format.stop_ids,
            generator=generator,
            on_token=streamer,
        )
        if streamer is not None:
            streamer.flush()
        message, problems = self.format.parse(self.format.decode(out.tokens), thinking)
        # a reply cut at max tokens says so even when it holds complete calls
        cut = out.finish_reason == "length"
        finish = "tool_calls" if message.get("tool_calls") and not cut else out.finish_reason
        usage = Usage(len(prompt.ids), len(out.tokens), out.reused)
        return Completion(message, usage, finish, time.perf_counter() - start, problems)


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    for source in (getattr(gen, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if source is None:
            continue
        ids.update(source if isinstance(source, list | tuple) else [source])
    if not ids:
        raise AgentError(
            "the model and its tokenizer name no end-of-sequence token; cannot tell when a reply ends"
        )
    return sorted(int(i) for i in ids)
