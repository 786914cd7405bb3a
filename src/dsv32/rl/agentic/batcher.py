"""The policy as a :mod:`dsv32.agent` backend that records what GRPO needs from every model call.

Episodes run through :class:`dsv32.agent.Agent` in threads, one per episode; each model call of each
episode goes to one :class:`LockstepBatcher`, which waits until every live episode has a call
pending (or has finished) and then samples all of them in one batched call of its rollout engine
(:mod:`dsv32.rl.engines`; default the policy's model in process) — G episodes × tasks decode
together, tools run in parallel between calls. With the in-process engine each episode's KV entries
are kept between its calls (:mod:`dsv32.engine.prefix`): a call prefills only the reply's end, the
tool results and what reopens the turn, and the G episodes of a task prefill their shared first
prompt once.

With a generator per episode (the G episodes of a task share one), each task's group draws from its
own generator: the in-process engine samples all groups in one call with a generator per row,
another engine gets one call per group (sent together, merged back in episode order). A group's
episodes then do not depend on which other tasks share the batch, so a step split by whole groups
over several processes samples what one process samples.

Each call leaves a :class:`StepRecord`: the exact prompt ids the model saw (the V3.2 encoding of the
conversation so far, :class:`~dsv32.agent.backends.formats.V32Format`), the sampled token ids (end
token included), their sampling log-probs (π_old), the kept sets of top-k/top-p (Keep Sampling
Mask) and, for the native MoE model, the experts of every position (Keep Routing). Training rows are
built from these records, never from re-tokenized text.

``tool_prompt``: ``"attach"`` renders the tools as V3.2's ``## Tools`` block in the system message;
``"none"`` leaves them out (the system prompt already describes them: Appendix B's Tables 7-8, or a
compact prompt).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dsv32.agent.backends.base import Completion, Usage
from dsv32.agent.backends.formats import V32Format
from dsv32.agent.errors import BackendError
from dsv32.engine.memory import release_free_memory
from dsv32.engine.prefix import PrefixCache
from dsv32.rl.engines import InProcessEngine, RolloutEngine, run_calls, split_calls
from dsv32.rl.grpo.rollout import SamplingConfig, truncates


@dataclass
class StepRecord:
    """One model call: ``prompt`` ids, sampled ``tokens`` (``logprobs`` per token), ``kept``
    ``[n, K]`` (−1 padded) or None, ``routing`` ``[layers, len(prompt) + n − 1, k]`` or None,
    ``indexing`` (the indexer's selections, row positions) laid out like ``routing``, or None;
    ``weight_version``: the engine's weights that sampled it."""

    prompt: list[int]
    tokens: list[int]
    logprobs: list[float]
    kept: torch.Tensor | None
    routing: torch.Tensor | None
    ended: bool
    weight_version: int | None = None
    indexing: torch.Tensor | None = None


class LockstepBatcher:
    """Batches the model calls of concurrent episodes (see the module docstring)."""

    def __init__(
        self,
        policy,
        sampling: SamplingConfig,
        stop_ids: Sequence[int],
        episodes: int,
        *,
        generator: torch.Generator | Sequence[torch.Generator] | None = None,
        keep_routing: bool = False,
        engine: RolloutEngine | None = None,
        reuse_prefix: bool = True,
        keep_indexing: bool = False,
    ) -> None:
        """``generator``: one for every call, or one per episode (``episodes`` of them; the
        episodes of a group share one object). ``reuse_prefix``: the in-process engine keeps each
        episode's KV entries between its calls (:mod:`dsv32.engine.prefix`; not with
        ``keep_routing`` or ``keep_indexing``, which record every position of each call)."""
        if generator is not None and not isinstance(generator, torch.Generator):
            generator = list(generator)
            if len(generator) != episodes:
                raise ValueError(f"generator: {len(generator)} generators for {episodes} episodes")
        self.policy, self.sampling, self.stop_ids = policy, sampling, list(stop_ids)
        self.engine = engine if engine is not None else InProcessEngine(policy.model)
        self.calls = 0  # batched calls so far (the engine's turn counter)
        self.generator, self.keep_routing = generator, keep_routing
        self.keep_indexing = keep_indexing
        self.cond = threading.Condition()
        self.live = episodes  # episodes that have not left yet
        self.pending: dict[int, list[int]] = {}  # episode → its pending prompt
        self.results: dict[int, StepRecord | BaseException] = {}
        in_process = self.engine.shares_weights and not (keep_routing or keep_indexing)
        self.prefix = PrefixCache() if reuse_prefix and in_process else None

    def leave(self) -> None:
        """An episode has finished: the others no longer wait for its calls."""
        with self.cond:
            self.live -= 1
            if self.live == 0 and self.prefix is not None:
                self.prefix.clear()  # the last episode is done: its entries are not needed
            self._maybe_run()

    # ------------------------------------------------------------------ calls
    def sample(self, episode: int, prompt: list[int]) -> StepRecord:
        """Episode ``episode``'s next call; returns when its batch has been sampled."""
        with self.cond:
            self.pending[episode] = prompt
            self._maybe_run()
            while episode not in self.results:
                self.cond.wait()
            result = self.results.pop(episode)
        if isinstance(result, BaseException):
            raise BackendError(f"batched generation failed: {result}") from result
        return result

    def _maybe_run(self) -> None:
        """Called with the lock held: when every live episode waits, run their calls as one batch."""
        if not self.pending or len(self.pending) < self.live:
            return
        # Every live episode has exactly one call here; ordered by episode, the batch (and so the
        # sampling noise each row gets) does not depend on which thread arrived first.
        keys = sorted(self.pending)
        prompts = [self.pending.pop(k) for k in keys]
        try:
            records = self._generate(keys, prompts)
            self.results.update(zip(keys, records))
        except (RuntimeError, ValueError) as err:
            if self.prefix is not None:
                self.prefix.clear()
            self.results.update({k: err for k in keys})
        self.cond.notify_all()

    @torch.no_grad()
    def _generate(self, keys: list[int], prompts: list[list[int]]) -> list[StepRecord]:
        """One batched call for the pending calls of episodes ``keys``; with a generator per
        episode and an engine in another process, one call per generator, sent together."""
        model = self.policy.model
        was = model.training
        model.eval()
        try:
            per_row = self.generator
            if per_row is not None and not isinstance(per_row, torch.Generator):
                per_row = [per_row[k] for k in keys]
            calls = split_calls(self.engine, range(len(keys)), per_row)
            outs = run_calls(calls, lambda c: self._call([prompts[j] for j in c[0]], c[1]))
        finally:
            model.train(was)
            if self.engine.shares_weights:  # the call's caches, freed in whichever thread ran it
                release_free_memory(collect=False)
        self.calls += 1
        records: list[StepRecord | None] = [None] * len(prompts)
        for (rows, _), out in zip(calls, outs):
            for j, record in zip(rows, self._records([prompts[j] for j in rows], out)):
                records[j] = record
        return records

    def _call(self, prompts: list[list[int]], generator):
        s = self.sampling
        return self.engine.generate(
            prompts,
            max_new_tokens=s.max_new_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            eos=self.stop_ids,
            pad=self.policy.pad_token_id,
            generator=generator,
            turn=self.calls,
            return_routing=self.keep_routing,
            return_kept=truncates(s),
            prefix=self.prefix,
            **({"return_indexing": True} if self.keep_indexing else {}),
        )

    def _records(self, prompts: list[list[int]], out) -> list[StepRecord]:
        """The records of one engine call (its routing laid out for its own prompts)."""
        P = max(len(p) for p in prompts)
        records = []
        for j, prompt in enumerate(prompts):
            tokens = out.tokens[j]
            n = len(tokens)
            routing = None
            if out.routing is not None:  # [layers, B, P + N - 1, k] → this row, without its left padding
                routing = out.routing[:, j, P - len(prompt) : P + n - 1].clone()
            indexing = None
            if self.keep_indexing and out.indexing is not None:  # row positions: only the columns move
                indexing = out.indexing[:, j, P - len(prompt) : P + n - 1].clone()
            kept = out.kept[j].clone() if out.kept is not None else None
            ended = n > 0 and tokens[-1] in self.stop_ids
            records.append(
                StepRecord(
                    list(prompt), tokens, out.logprobs[j], kept, routing, ended, out.weight_version, indexing
                )
            )
        return records


class RecordingBackend:
    """One episode's backend: V3.2 prompts, batched sampling, a :class:`StepRecord` per call."""

    def __init__(
        self, batcher: LockstepBatcher, episode: int, tokenizer, *, tool_prompt: str = "attach"
    ) -> None:
        if tool_prompt not in ("attach", "none"):
            raise ValueError(f"tool_prompt must be 'attach' or 'none', got {tool_prompt!r}")
        self.batcher, self.episode = batcher, episode
        self.format = V32Format(tokenizer)
        self.tool_prompt = tool_prompt
        self.records: list[StepRecord] = []

    def _tools(self, tools: Sequence[dict]) -> list[dict]:
        return list(tools) if self.tool_prompt == "attach" else []

    def count_tokens(self, messages: Sequence[dict], tools: Sequence[dict], *, thinking: bool = True) -> int:
        return len(self.format.prompt(messages, self._tools(tools), thinking).ids)

    def reply_budget(self, sampling: dict | None = None) -> int:
        """Every call samples up to the batcher's ``max_new_tokens``."""
        return self.batcher.sampling.max_new_tokens

    def complete(self, messages, tools, *, thinking=True, sampling=None, on_delta=None) -> Completion:
        start = time.perf_counter()
        prompt = self.format.prompt(messages, self._tools(tools), thinking)
        record = self.batcher.sample(self.episode, list(prompt.ids))
        self.records.append(record)
        message, problems = self.format.parse(self.format.decode(record.tokens), thinking)
        # a reply cut at max tokens says so even when it holds complete calls (the episode stops)
        finish = "length" if not record.ended else ("tool_calls" if message.get("tool_calls") else "stop")
        usage = Usage(len(prompt.ids), len(record.tokens), 0)
        return Completion(message, usage, finish, time.perf_counter() - start, problems)
