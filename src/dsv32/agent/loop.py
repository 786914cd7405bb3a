"""The agent loop: think, call tools, read their results, repeat until an answer (paper §3.2, §4.4).

One step::

    tokens = backend.count_tokens(context)            # only with a context_window W
    if tokens > min(trigger · W, W − max_tokens):  reset the context by the strategy
    (none, parallel_fewest_step: if tokens > W − max_tokens: stop: "context")
    reply = backend.complete(context, tools, thinking)  # an endpoint's refusal for the context
                                                      # length: as if tokens were over the limit
    context += [reply];  cut at max tokens (finish_reason "length") → stop: "length"
    no tool calls, none attempted → stop: "answer" (final = reply.content)
    for each call in reply.tool_calls, in order:  context += [tool result]   (errors are results too)
    a call that could not be read → context += [user message: what was wrong]   (see replies.py)

and the episode stops with ``"max_steps"`` after ``max_steps`` model calls or ``"error"`` when the
backend fails (:class:`~dsv32.agent.errors.BackendError`, after its own retries) or cannot render
the conversation (an ``AgentError`` or ``ConversationError`` it raises mid-episode).

Thinking context (§3.2.1): the reasoning of the assistant turns of the current task stays in the
context across all its tool calls; reasoning before the last user message is dropped when the
episode starts (a conversation passed in as history) and whenever a ``summary`` reset re-initiates
the rollout with a new user message. Tool calls and results are always kept. Backends apply the same
rule to whatever they are sent.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from typing import Any

from dsv32.agent.backends.base import Backend, Completion
from dsv32.agent.context import (
    DEFAULT_TRIGGER,
    UNMANAGED,
    check_strategy,
    fewest_steps,
    fit_summary_request,
    kept_positions,
    reinitiate,
)
from dsv32.agent.errors import AgentError, BackendError, ContextLengthError
from dsv32.agent.replies import call_error
from dsv32.agent.rollout import Rollout, spans_of
from dsv32.agent.tools import DEFAULT_MAX_OUTPUT_CHARS, DEFAULT_TIMEOUT_S, Tool, Toolbox
from dsv32.agent.trajectory import ContextEvent, Step, ThreadSummary, ToolRecord, Trajectory
from dsv32.chat import ConversationError, apply_thinking_context, last_user_index

#: ``on_event(kind, payload)``: "thread" {thread}, "delta" {kind, text}, "tool_call" {id, name,
#: arguments}, "tool_result" {id, name, ok, error, content}, "context" {ContextEvent fields},
#: "call_error" {content}, "step" {step: Step}, "stop" {stop_reason, final}.
EventHandler = Callable[[str, dict], None]


class Agent:
    """A tool-using agent over any backend (see the module docstring for the loop).

    Args:
        backend: a :class:`~dsv32.agent.backends.base.Backend` (local model, OpenAI-compatible
            endpoint, scripted replies).
        tools: :class:`~dsv32.agent.tools.Tool` objects or plain functions (schema from type hints).
        system: a system prompt put before a task given as a string.
        thinking: reason before answering (V3.2 thinking mode); False is chat mode.
        max_steps: model calls per trajectory, summary calls included.
        context_window: the model's window in tokens; None disables context management.
        context: ``"none"``, ``"summary"``, ``"discard_75"``, ``"discard_all"`` or
            ``"parallel_fewest_step"`` (see :mod:`dsv32.agent.context`).
        context_trigger: the fraction of the window that triggers the strategy (paper: 0.8).
        parallel: trajectories of ``parallel_fewest_step``.
        discard_fraction: the share of rounds ``discard_75`` removes.
        sampling: settings passed to every backend call (``temperature``, ``top_p``, ``max_tokens`` ...);
            a ``seed`` is ``seed + i`` in thread ``i`` of ``parallel_fewest_step``.
        tool_timeout_s / max_tool_output_chars: see :class:`~dsv32.agent.tools.Toolbox`.
        on_event: called as things happen (streaming to a terminal, logging).
    """

    def __init__(
        self,
        backend: Backend,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        *,
        system: str | None = None,
        thinking: bool = True,
        max_steps: int = 50,
        context_window: int | None = None,
        context: str = "none",
        context_trigger: float = DEFAULT_TRIGGER,
        parallel: int = 4,
        discard_fraction: float = 0.75,
        sampling: dict | None = None,
        tool_timeout_s: float | None = DEFAULT_TIMEOUT_S,
        max_tool_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        on_event: EventHandler | None = None,
    ) -> None:
        self.backend = backend
        self.toolbox = (
            tools
            if isinstance(tools, Toolbox)
            else Toolbox(tools, timeout_s=tool_timeout_s, max_output_chars=max_tool_output_chars)
        )
        self.system = system
        self.thinking = thinking
        self.context = check_strategy(context)
        if max_steps < 1:
            raise AgentError(f"max_steps must be at least 1, got {max_steps}")
        if context_window is not None and context_window < 1:
            raise AgentError(f"context_window must be a positive number of tokens, got {context_window}")
        if not 0.0 < context_trigger <= 1.0:
            raise AgentError(f"context_trigger must be in (0, 1], got {context_trigger}")
        if not 0.0 < discard_fraction <= 1.0:
            raise AgentError(f"discard_fraction must be in (0, 1], got {discard_fraction}")
        if parallel < 1:
            raise AgentError(f"parallel must be at least 1, got {parallel}")
        if context not in ("none", "parallel_fewest_step") and context_window is None:
            raise AgentError(f"context={context!r} needs context_window (the model's window in tokens)")
        self.max_steps = max_steps
        self.context_window = context_window
        self.context_trigger = context_trigger
        self.parallel = parallel
        self.discard_fraction = discard_fraction
        self.sampling = dict(sampling or {})
        self.on_event = on_event

    # ------------------------------------------------------------------------------------ public
    def run(self, task: str | Sequence[dict]) -> Trajectory:
        """Run one task: a string (the user's message) or OpenAI-style messages (a system prompt,
        earlier turns, the task as the last user message)."""
        initial = self.initial_messages(task)
        if self.context != "parallel_fewest_step":
            return self._episode(initial, self.context, thread=0)
        runs = [self._episode(initial, "none", thread=i) for i in range(self.parallel)]
        return combine_threads(runs)

    def initial_messages(self, task: str | Sequence[dict]) -> list[dict]:
        if isinstance(task, str):
            if not task.strip():
                raise AgentError("the task is empty")
            system = [{"role": "system", "content": self.system}] if self.system else []
            messages = [*system, {"role": "user", "content": task}]
        elif isinstance(task, Sequence) and all(isinstance(m, dict) for m in task):
            messages = [dict(m) for m in task]
            has_system = any(m.get("role") == "system" for m in messages)
            if self.system and has_system:
                raise AgentError("the task messages have a system prompt and so does the agent; give one")
            if self.system:
                messages.insert(0, {"role": "system", "content": self.system})
        else:
            raise AgentError("a task is a string or a list of OpenAI-style message dicts")
        if last_user_index(messages) < 0:
            raise AgentError("the task messages have no user message")
        return apply_thinking_context(messages) if self.thinking else messages

    # ------------------------------------------------------------------------------------ episode
    def _emit(self, kind: str, payload: dict) -> None:
        if self.on_event is not None:
            self.on_event(kind, payload)

    # A backend that cannot render the conversation mid-episode (a chat template that raises on it, a
    # sampling setting it does not know) fails like one that cannot answer: the episode stops with
    # "error" and keeps what it did.
    def _call(self, messages: list[dict], sampling: dict) -> Completion:
        on_delta = None
        if self.on_event is not None:

            def on_delta(kind: str, text: str) -> None:
                self._emit("delta", {"kind": kind, "text": text})

        try:
            tools = self.toolbox.schemas
            return self.backend.complete(
                messages, tools, thinking=self.thinking, sampling=sampling, on_delta=on_delta
            )
        except (AgentError, ConversationError) as err:
            raise BackendError(str(err)) from err

    def _count(self, messages: list[dict]) -> int:
        try:
            return self.backend.count_tokens(messages, self.toolbox.schemas, thinking=self.thinking)
        except (AgentError, ConversationError) as err:
            raise BackendError(str(err)) from err

    def _episode(self, initial: list[dict], strategy: str, thread: int) -> Trajectory:
        self._emit("thread", {"thread": thread})
        run = Rollout(initial, strategy)
        traj = run.traj
        pending: list[ContextEvent] = []
        sampling = dict(self.sampling)
        if sampling.get("seed") is not None:  # threads differ as vLLM's choices do: seed + i
            sampling["seed"] = int(sampling["seed"]) + thread
        limit = self._limit(strategy, sampling)
        try:
            while len(traj.steps) < self.max_steps:
                tokens = self._count(run.context) if limit is not None else 0
                refused: ContextLengthError | None = None
                if limit is None or tokens <= limit:
                    try:
                        completion = self._call(run.context, self._fit_reply(sampling, tokens))
                    except ContextLengthError as err:  # the endpoint counted more than we did
                        refused = err
                if refused is not None or (limit is not None and tokens > limit):
                    event = None
                    if limit is not None and strategy not in UNMANAGED:
                        tokens = max(tokens, refused.prompt_tokens or 0) if refused else tokens
                        event = self._reset(run, strategy, tokens, limit, thread, sampling)
                    if event is None:
                        traj.stop_reason = "context"
                        traj.error = (
                            str(refused)
                            if refused
                            else self._context_reason(tokens, limit, strategy, sampling, len(traj.steps))
                        )
                        break
                    pending.append(event)
                    continue
                step = self._record(traj, completion, "act", thread, pending, run.visible())
                pending = []
                message = completion.message
                calls = message.get("tool_calls") or []
                for k, call in enumerate(calls):
                    call.setdefault("id", f"call_{thread}_{step.index}_{k}")
                run.add(message)
                if completion.finish_reason == "length":  # cut at max tokens: no answer, no calls run
                    traj.stop_reason = "length"
                    self._emit("step", {"step": step})
                    break
                step.call_error = call_error(completion)
                if not calls and step.call_error is None:
                    traj.final, traj.stop_reason = message.get("content") or "", "answer"
                    self._emit("step", {"step": step})
                    break
                for call in calls:
                    record, result = self._run_tool(call)
                    step.tool_calls.append(record)
                    step.tool_latency_s += record.latency_s
                    run.add(result)
                if step.call_error is not None:
                    self._emit("call_error", {"content": step.call_error})
                    run.add({"role": "user", "content": step.call_error})
                self._emit("step", {"step": step})
        except BackendError as err:
            traj.stop_reason, traj.error = "error", str(err)
        traj.total_steps = len(traj.steps)
        traj.total_tokens = sum(s.tokens for s in traj.steps)
        self._emit("stop", {"stop_reason": traj.stop_reason, "final": traj.final, "thread": thread})
        return traj

    def _reply_budget(self, sampling: dict) -> int | None:
        """The ``max_tokens`` of a call with ``sampling`` (the backend's ``reply_budget`` when it has
        one, else the setting itself); None when unknown."""
        budget = getattr(self.backend, "reply_budget", None)
        if callable(budget):
            return budget(sampling)
        for key in ("max_tokens", "max_completion_tokens", "max_new_tokens"):
            if sampling.get(key) is not None:
                return int(sampling[key])
        return None

    def _fit_reply(self, sampling: dict, tokens: int) -> dict:
        """``sampling`` for a call whose prompt holds ``tokens``: a ``max_tokens`` as large as the window
        (the paper's 128K generation length in a 128K window) becomes what the prompt leaves of it, as
        an endpoint requires prompt + max_tokens to fit; any other budget is sent as it is."""
        window, budget = self.context_window, self._reply_budget(sampling)
        if window is None or budget is None or budget < window:
            return sampling
        return with_max_tokens(sampling, max(1, window - tokens))

    def _summary_budget(self, sampling: dict) -> int:
        """The tokens the summary may take: the reply's ``max_tokens``, or when it is unknown (or the
        whole window) what the trigger leaves, ``(1 − trigger) · W`` (at least a tenth of ``W``)."""
        window = self.context_window
        budget = self._reply_budget(sampling)
        if budget is not None and budget < window:
            return budget
        return max(1, round(max(1.0 - self.context_trigger, 0.1) * window))

    def _context_reason(self, tokens: int, limit: float, strategy: str, sampling: dict, step: int) -> str:
        """Why an episode stopped for the context: what did not fit, the limit and where it comes from."""
        window, budget = self.context_window, self._reply_budget(sampling)
        kept = budget if budget is not None and budget < window else 1
        what = (
            "the first prompt (system prompt, task and tool schemas)"
            if step == 0
            else f"the prompt of step {step}"
        )
        if limit < window - kept:
            why = (
                f"context_trigger {self.context_trigger:g} × the {window}-token context_window, and the "
                f"{strategy} strategy left nothing more to drop"
            )
        else:
            why = f"the {window}-token context_window less {kept} token(s) kept for the reply (max_tokens)"
        return (
            f"{what} holds {tokens} tokens, over the limit of {limit:g}: {why}; raise context_window, "
            "lower max_tokens or shorten the task"
        )

    def _limit(self, strategy: str, sampling: dict) -> float | None:
        """The most tokens a step's prompt may hold: the window less the reply's ``max_tokens``, and
        for the strategies that manage the context at most ``trigger · context_window`` (beyond the
        limit they act). Under ``none`` and in the threads of ``parallel_fewest_step`` (§4.4's
        unmanaged baselines) the episode stops there. A ``max_tokens`` that is unknown, or as large as
        the window (a reply that may take whatever the prompt leaves, as the paper's 128K generation
        length in a 128K window), keeps one token."""
        window = self.context_window
        if window is None:
            return None
        budget = self._reply_budget(sampling)
        room = window - (budget if budget is not None and budget < window else 1)
        if strategy in UNMANAGED:
            return room
        return min(self.context_trigger * window, room)

    def _record(
        self,
        traj: Trajectory,
        completion: Completion,
        kind: str,
        thread: int,
        events: list[ContextEvent],
        visible: list[list[int]],
        omitted: list[int] | None = None,
    ) -> Step:
        usage = completion.usage
        step = Step(
            index=len(traj.steps),
            kind=kind,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            cached_tokens=usage.cached_tokens,
            latency_s=completion.latency_s,
            finish_reason=completion.finish_reason,
            context_events=list(events),
            problems=list(completion.problems),
            thread=thread,
            visible=visible,
            omitted=omitted or [],
        )
        traj.steps.append(step)
        return step

    def _run_tool(self, call: dict) -> tuple[ToolRecord, dict]:
        function = call.get("function") or {}
        name = function.get("name")
        self._emit("tool_call", {"id": call["id"], "name": name, "arguments": function.get("arguments")})
        out = self.toolbox.execute(call)
        record = ToolRecord(
            str(name), call["id"], out.ok, out.error, out.latency_s, out.output_chars, out.truncated
        )
        self._emit(
            "tool_result",
            {"id": call["id"], "name": name, "ok": out.ok, "error": out.error, "content": out.content},
        )
        return record, {"role": "tool", "tool_call_id": call["id"], "content": out.content}

    # ------------------------------------------------------------------------------------ resets
    def _reset(
        self, run: Rollout, strategy: str, tokens: int, limit: float, thread: int, sampling: dict
    ) -> ContextEvent | None:
        """Apply ``strategy`` to ``run``'s context: the event, or None when the episode must stop
        (nothing left to remove, an empty summary, or still over the limit)."""
        traj, context, anchor = run.traj, run.context, run.anchor
        step = len(traj.steps)
        summary = None
        details: dict[str, Any] = {}
        completion = None
        if strategy == "summary":
            budget = self._summary_budget(sampling)
            room = self.context_window - budget
            fitted = fit_summary_request(context, anchor, self.thinking, lambda m: self._count(m) <= room)
            if fitted is not None:
                request, omitted, details["left_out"] = fitted
                with contextlib.suppress(ContextLengthError):  # refused: reset as discard_all does
                    completion = self._call(request, with_max_tokens(sampling, budget))
            if completion is None:  # the request cannot fit: this reset is discard_all's
                details["fallback"] = "discard_all"
        if completion is not None:
            # the transcript keeps the request and the reply (not its calls: they are not run)
            asked = run.note(request[-1])
            message = {k: v for k, v in completion.message.items() if k != "tool_calls"}
            run.note(message)
            seen = [run.where[p] for p in omitted]
            self._record(traj, completion, "summary", thread, [], spans_of([*run.where, asked]), seen)
            summary = (message.get("content") or message.get("reasoning_content") or "").strip()
            details["summary_truncated"] = completion.finish_reason == "length"
            if not summary:
                return None
            removed = len(context) - anchor
            fresh = reinitiate(run.initial, summary)
            run.restart(fresh, last_user_index(fresh))
        else:
            fraction = self.discard_fraction if strategy == "discard_75" else 1.0
            kept = kept_positions(context, anchor, fraction)
            removed = len(context) - len(kept)
            if removed == 0:
                return None
            run.keep(kept)
        after = self._count(run.context)
        event = ContextEvent(step, strategy, tokens, after, removed, summary, **details)
        traj.context_events.append(event)
        self._emit("context", asdict(event))
        if after > limit:
            return None
        return event


def with_max_tokens(sampling: dict, tokens: int) -> dict:
    """``sampling`` with its reply budget set to ``tokens``, under the key it already uses."""
    key = next((k for k in ("max_completion_tokens", "max_new_tokens") if k in sampling), "max_tokens")
    return {**sampling, key: tokens}


def combine_threads(runs: Sequence[Trajectory]) -> Trajectory:
    """``parallel_fewest_step``: the winning trajectory (see :func:`~dsv32.agent.context.fewest_steps`)
    with every thread summarized in ``threads`` and the budget of all of them in the totals."""
    winner = runs[fewest_steps([r.stop_reason for r in runs], [r.num_steps for r in runs])]
    winner.strategy = "parallel_fewest_step"
    winner.threads = [
        ThreadSummary(i, r.stop_reason, r.num_steps, r.total_tokens, r.final) for i, r in enumerate(runs)
    ]
    winner.total_steps = sum(r.total_steps for r in runs)
    winner.total_tokens = sum(r.total_tokens for r in runs)
    return winner
