"""Cold-start conversations (paper §3.2.2, Appendix B): verified thinking-with-tools transcripts for SFT.

Two sources, one rule — a transcript is kept only when the environment's verifier gives it reward 1
(a teacher's episode must also have ended with an answer, not cut at max tokens or stopped otherwise,
and hold no reply whose tool call could not be read):

- ``reference``: the environment's reference solution (``env.reference(task)``) played through its
  real tools (:func:`dsv32.envs.base.replay`), so every tool result in the transcript is what the
  tool returned; each assistant turn gets a short reasoning (``reasoning_content``) where the
  reference has none, so the turn reads "think, call, read, answer" as V3.2's thinking mode does;
- a **teacher** (any :mod:`dsv32.synth.backends` spec: an OpenAI-compatible endpoint or a local
  model) that runs the task as an agent (:class:`dsv32.agent.Agent` over the environment's tools),
  ``samples`` times per task.

The system message is one of :data:`PROMPTS` (:data:`dsv32.chat.templates.EPISODE_PROMPTS`):

- ``reasoning_agent`` — Appendix B Table 8 (call tools inside the reasoning, answer without tools),
  with the tool descriptions and the DSML call format in the prompt text itself;
- ``agent`` — Table 7 (the Jupyter tool guidance, tools and call format);
- ``env`` — the environment's own system prompt, with ``tools`` attached (V3.2 renders them as its
  ``## Tools`` block);
- ``bare`` — the environment's own system prompt only (it names its tools in words): the shortest
  prompt, for small models on a CPU budget; what the model must produce is the same DSML.

A row is ``{"id", "domain", "messages", "tools"?, "meta": {"source", "reward", "task"}}``, the input
of ``dsv32 sft``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dsv32.chat.templates import EPISODE_PROMPTS as PROMPTS
from dsv32.chat.templates import episode_system_message as system_message
from dsv32.envs.base import Environment, Task, replay
from dsv32.runlog import write_text
from dsv32.synth.records import SynthError

#: What ``env.reward(...).value`` must reach for a transcript to be kept.
VERIFIED = 1.0


def check_run(prompt: str, samples: int, workers: int) -> None:
    """Refuse, before any episode runs, a prompt that is not one of :data:`PROMPTS` and fewer than one
    sample per task or one worker."""
    if prompt not in PROMPTS:
        raise SynthError(f"prompt {prompt!r} is not one of {', '.join(PROMPTS)}")
    if samples < 1 or workers < 1:
        raise SynthError(f"samples and workers must be >= 1, got {samples} and {workers}")


def check_out(out_path: str | Path, overwrite: bool = False) -> Path:
    """Refuse, before any episode runs, an output file that cannot be written: a directory, an existing
    file without ``overwrite``, a path under a file or under a directory that is not writable."""
    path = Path(out_path)
    if path.is_dir():
        raise SynthError(f"--out {path} is a directory; give the path of a JSONL file")
    if path.exists() and not overwrite:
        raise SynthError(f"--out {path} exists; pass --overwrite to replace it, or choose another --out")
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise SynthError(f"cannot write --out {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise SynthError(f"cannot write --out {path}: {parent} is not writable")
    return path


def write_rows(out_path: Path, rows: Iterable[dict]) -> None:
    """Write ``rows`` as JSONL to a temporary file beside ``out_path``, then rename it over
    ``out_path``: a reader (or an interrupted run) sees the old file or the new one, never a part."""
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)  # fails before any write
    out_path.parent.mkdir(parents=True, exist_ok=True)
    write_text(out_path, text)


def check_outcomes(outcomes: Sequence[Outcome], written: int, out_path: Path) -> None:
    """Refuse to write a set without a single row: every episode failed (the backend: an endpoint
    down), or none was verified. ``out_path`` is left as it was."""
    errors = [o.error for o in outcomes if o.error]
    if outcomes and len(errors) == len(outcomes):
        raise SynthError(
            f"every episode ({len(outcomes)}) stopped with an error (first: {errors[0]}); "
            f"{out_path} is left as it was"
        )
    if not written:
        reasons: dict[str, int] = {}
        for o in outcomes:
            if o.row is None:
                reasons[o.reason] = reasons.get(o.reason, 0) + 1
        listed = ", ".join(f"{n} × {why}" for why, n in reasons.items())
        if any(o.row is not None for o in outcomes):
            listed = ", ".join(filter(None, [listed, "the mix weights keep none of the verified ones"]))
        raise SynthError(f"no conversation to write ({listed}); {out_path} is left as it was")


def _first_line(text: str, limit: int = 200) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[:limit] + " ..."


def add_reasoning(messages: list[dict]) -> list[dict]:
    """Copies of ``messages`` whose assistant turns without ``reasoning_content`` get a short one: a
    tool-calling turn says which tool it runs and why, a later turn what the last tool returned."""
    out, last_result = [], None
    for message in messages:
        message = dict(message)
        if message["role"] == "tool":
            last_result = message.get("content", "")
        elif message["role"] == "assistant" and not message.get("reasoning_content"):
            calls = message.get("tool_calls") or []
            if calls:
                names = ", ".join(dict.fromkeys(c["function"]["name"] for c in calls))
                message["reasoning_content"] = (
                    f"I need an exact result, so I compute it with the {names} tool."
                )
            elif last_result is not None:
                message["reasoning_content"] = f"The tool returned {_first_line(last_result)}."
            else:
                message["reasoning_content"] = "I can answer directly."
        out.append(message)
    return out


def conversation_row(
    task: Task,
    env_name: str,
    messages: list[dict],
    tools: list[dict],
    prompt: str,
    source: str,
    reward: float,
) -> dict:
    """A cold-start row: ``messages`` whose first (system) message is replaced by ``prompt``'s."""
    if not messages or messages[0]["role"] != "system":
        raise SynthError(f"task {task.id!r}: the episode does not start with a system message")
    system = system_message(prompt, messages[0]["content"], tools)
    row: dict[str, Any] = {"id": task.id, "domain": env_name, "messages": [system, *messages[1:]]}
    if prompt == "env":
        row["tools"] = tools
    row["meta"] = {"source": source, "reward": reward, "task": task.id}
    return row


@dataclass
class Outcome:
    """One attempt: the row when it was verified, else why not (``error``: the backend's failure)."""

    task: str
    row: dict | None
    reward: float
    reason: str = ""
    error: str = ""


def reference_outcome(make_env: Callable[[], Environment], task: Task, prompt: str) -> Outcome:
    """Replay the reference through a fresh environment and keep it if the verifier accepts it."""
    with make_env() as env:
        episode = replay(env, task, env.reference(task))
        reward = env.reward(episode)
        tools = env.tools()
    if reward.value < VERIFIED:
        return Outcome(task.id, None, reward.value, f"reference not verified (reward {reward.value:g})")
    messages = add_reasoning(episode.messages)
    return Outcome(
        task.id,
        conversation_row(task, env.name, messages, tools, prompt, "reference", reward.value),
        reward.value,
    )


def teacher_outcome(
    make_env: Callable[[], Environment], task: Task, prompt: str, spec: Any, max_steps: int
) -> Outcome:
    """One agent episode of a teacher backend (a :class:`dsv32.synth.backends.BackendSpec`)."""
    from dsv32.agent import run_episode

    with make_env() as env:
        tools = env.tools()
        trajectory, reward = run_episode(
            spec.make(),
            env,
            task,
            prompt=prompt,
            thinking=spec.thinking,
            max_steps=max_steps,
            sampling=dict(spec.sampling),
        )
    if trajectory.stop_reason != "answer" or reward.value < VERIFIED:
        answered = trajectory.stop_reason == "answer"
        why = f"reward {reward.value:g}" if answered else f"stopped with {trajectory.stop_reason}"
        error = (trajectory.error or "the backend failed") if trajectory.stop_reason == "error" else ""
        return Outcome(task.id, None, reward.value, why, error)
    if any(step.call_error for step in trajectory.steps):
        # the conversation holds a reply whose call could not be read: no turn to learn from
        return Outcome(task.id, None, reward.value, "a tool call that could not be read")
    row = conversation_row(task, env.name, trajectory.messages, tools, prompt, spec.label, reward.value)
    return Outcome(task.id, row, reward.value)


@dataclass
class ColdStartReport:
    kept: int = 0
    rejected: int = 0
    tasks: int = 0
    tasks_with_a_kept_row: int = 0
    reasons: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def build_coldstart(
    make_env: Callable[[], Environment],
    tasks: Sequence[Task],
    out_path: str | Path,
    *,
    prompt: str = "reasoning_agent",
    teacher: Any = None,
    samples: int = 1,
    max_steps: int = 8,
    workers: int = 4,
    overwrite: bool = False,
) -> ColdStartReport:
    """Write the verified conversations of ``tasks`` to ``out_path`` (JSONL, in task order) and return
    what was kept and rejected. ``teacher`` None uses the reference solutions (one per task);
    otherwise ``samples`` teacher episodes per task. Episodes run in ``workers`` threads, each with its
    own environment (``make_env()``).

    ``out_path`` is checked before any episode runs (:func:`check_out`; an existing file is replaced
    only with ``overwrite``) and written at once at the end (:func:`write_rows`). Nothing is written
    when no conversation was kept — every episode failed, or none was verified: that raises
    :class:`SynthError` (:func:`check_outcomes`)."""
    check_run(prompt, samples, workers)
    if not tasks:
        raise SynthError("no tasks to build cold-start conversations from")
    out_path = check_out(out_path, overwrite)
    if teacher is None:
        jobs = [lambda t=t: reference_outcome(make_env, t, prompt) for t in tasks]
    else:
        jobs = [
            lambda t=t: teacher_outcome(make_env, t, prompt, teacher, max_steps)
            for t in tasks
            for _ in range(samples)
        ]
    with ThreadPoolExecutor(workers) as pool:
        outcomes = list(pool.map(lambda job: job(), jobs))
    report = ColdStartReport(tasks=len(tasks))
    rows = []
    for o in outcomes:
        if o.row is None:
            report.rejected += 1
            report.reasons[o.reason] = report.reasons.get(o.reason, 0) + 1
            continue
        report.kept += 1
        rows.append(o.row)
    report.tasks_with_a_kept_row = len({o.task for o in outcomes if o.row is not None})
    check_outcomes(outcomes, len(rows), out_path)
    write_rows(out_path, rows)
    return report
