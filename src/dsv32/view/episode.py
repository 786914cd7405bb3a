"""One episode as HTML: every turn of the conversation — the system prompt and the task, each
assistant turn's reasoning (collapsed), answer text and tool calls with their arguments, each tool
result — then the final answer, the reward or score with the verifier's reason, the tokens and why it
stopped, and one line per model call.

The sources of an episode, each read as it is written:

- a trajectory (:meth:`dsv32.agent.trajectory.Trajectory.save`: ``messages``, ``final``, ``steps``,
  ``stop_reason``, ``total_tokens``…), with the reward of its row in a ``dsv32 envs run`` directory;
- a sample row of an evaluation run (``samples.jsonl``: ``prompt`` and ``completion``, or the
  episode's ``messages``; ``score``, ``reason``, tokens, ``finish_reason`` or ``stop_reason``);
- a bare conversation (a list of OpenAI-style messages, as ``eval_<stage>.json`` keeps samples).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from dsv32.view.page import badge, esc, number


@dataclass
class Episode:
    """What the page shows of one episode (every field may be missing from a source)."""

    title: str
    messages: list[dict]
    final: str | None = None
    score: float | None = None
    passed: bool | None = None
    reason: str | None = None
    stop_reason: str | None = None
    tokens: dict[str, Any] = field(default_factory=dict)
    steps: list[dict] = field(default_factory=list)
    error: str | None = None


def from_trajectory(data: dict, title: str, result: dict | None = None) -> Episode:
    """A saved trajectory; ``result``: its row of a ``dsv32 envs run`` (``reward``, ``reason``)."""
    steps = [s for s in data.get("steps") or [] if isinstance(s, dict)]
    reward = (result or {}).get("reward")
    tokens = {
        "prompt": sum(_int(s.get("prompt_tokens")) for s in steps),
        "completion": sum(_int(s.get("completion_tokens")) for s in steps),
        "total": data.get("total_tokens"),
        "model calls": data.get("total_steps") or len(steps),
    }
    return Episode(
        title=title,
        messages=_messages(data.get("messages")),
        final=data.get("final"),
        score=reward,
        passed=None if reward is None else reward >= 1.0,
        reason=(result or {}).get("reason"),
        stop_reason=data.get("stop_reason"),
        tokens=tokens,
        steps=steps,
        error=data.get("error"),
    )


def from_sample(row: dict, title: str) -> Episode:
    """A row of an evaluation run's ``samples.jsonl`` (single-turn or an episode)."""
    if isinstance(row.get("messages"), list):  # an episode: the whole conversation
        messages = _messages(row["messages"])
        final = row.get("completion")
        tokens = {
            "total": row.get("tokens"),
            "model calls": row.get("steps"),
            "context resets": row.get("resets"),
        }
        stop = row.get("stop_reason")
    else:
        completion = row.get("completion")
        messages = _messages(row.get("prompt")) + ([completion] if isinstance(completion, dict) else [])
        final = completion.get("content") if isinstance(completion, dict) else completion
        tokens = {"prompt": row.get("prompt_tokens"), "completion": row.get("completion_tokens")}
        stop = row.get("finish_reason")
    score = row.get("score")
    return Episode(
        title=title,
        messages=messages,
        final=final if final is None or isinstance(final, str) else json.dumps(final, ensure_ascii=False),
        score=score,
        passed=passed(score),
        reason=row.get("reason"),
        stop_reason=stop,
        tokens={k: v for k, v in tokens.items() if v is not None},
    )


def from_messages(messages: Any, title: str) -> Episode:
    msgs = _messages(messages)
    finals = [m.get("content") for m in msgs if m.get("role") == "assistant" and not m.get("tool_calls")]
    return Episode(title=title, messages=msgs, final=finals[-1] if finals else None)


def passed(score: Any) -> bool | None:
    """A score counts as passed at 1 (partial credit is not a pass, as pass@k counts it)."""
    if isinstance(score, bool):
        return score
    return None if not isinstance(score, (int, float)) else score >= 1.0 - 1e-9


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _messages(value: Any) -> list[dict]:
    if not isinstance(value, list):
        return []
    return [m if isinstance(m, dict) else {"role": "?", "content": m} for m in value]


# ---------------------------------------------------------------------------------------------- HTML
def text_of(content: Any) -> str:
    """A message's content as text: a string as it is, a list of parts as their text, else JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            p.get("text") if isinstance(p, dict) and isinstance(p.get("text"), str) else p for p in content
        ]
        if all(isinstance(p, str) for p in parts):
            return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False, indent=1, default=str)


def _arguments(arguments: Any) -> str:
    """Tool-call arguments as indented JSON (a string that is not JSON as it was written)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    return json.dumps(arguments, ensure_ascii=False, indent=1, default=str)


def _pre(text: str) -> str:
    return f"<pre>{esc(text)}</pre>"


def _calls(message: dict, names: dict[str, str]) -> str:
    out = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function") if isinstance(call, dict) else None
        fn = fn if isinstance(fn, dict) else {}
        name = fn.get("name") or (call.get("name") if isinstance(call, dict) else None) or "?"
        call_id = call.get("id") if isinstance(call, dict) else None
        if call_id:
            names[str(call_id)] = str(name)
        arguments = fn.get("arguments", call.get("arguments") if isinstance(call, dict) else None)
        ident = f'<span class="meta">{esc(call_id)}</span>' if call_id else ""
        out.append(
            f'<div class="call">→ <span class="name">{esc(name)}</span>{ident}'
            f"{_pre(_arguments(arguments))}</div>"
        )
    return "".join(out)


def _step_meta(step: dict | None) -> str:
    if not step:
        return ""
    bits = [
        f"{step.get('prompt_tokens', '?')} prompt + {step.get('completion_tokens', '?')} completion tokens",
        f"finish: {step.get('finish_reason')}" if step.get("finish_reason") else "",
        f"{step.get('kind')} call" if step.get("kind") not in (None, "act") else "",
    ]
    return f'<span class="meta">{esc(" · ".join(b for b in bits if b))}</span>'


def turns_html(ep: Episode) -> str:
    """Every message of the episode, in order; the n-th assistant turn carries the n-th model call's
    tokens and finish reason when the trajectory has one call per assistant turn."""
    assistants = [m for m in ep.messages if m.get("role") == "assistant"]
    calls = [s for s in ep.steps if s.get("thread", 0) == 0]
    paired = len(calls) == len(assistants)
    names: dict[str, str] = {}
    out, n = [], 0
    for message in ep.messages:
        role = str(message.get("role") or "?")
        text = text_of(message.get("content"))
        if role == "system":
            out.append(
                f'<div class="turn system"><details><summary><span class="role">system</span> '
                f'<span class="meta">{len(text)} chars</span></summary>{_pre(text)}</details></div>'
            )
        elif role == "assistant":
            meta = _step_meta(calls[n] if paired else None)
            n += 1
            reasoning = message.get("reasoning_content")
            parts = [f'<span class="role">assistant</span>{meta}']
            if reasoning:
                parts.append(
                    f"<details><summary>reasoning · {len(str(reasoning))} chars</summary>"
                    f"{_pre(text_of(reasoning))}</details>"
                )
            if text:
                parts.append(_pre(text))
            parts.append(_calls(message, names))
            out.append(f'<div class="turn assistant">{"".join(parts)}</div>')
        elif role == "tool":
            call_id = str(message.get("tool_call_id") or "")
            name = message.get("name") or names.get(call_id, "")
            label = " · ".join(x for x in (name, call_id) if x)
            out.append(
                f'<div class="turn tool"><span class="role">tool result</span>'
                f'<span class="meta">{esc(label)}</span>{_pre(text)}</div>'
            )
        else:
            out.append(
                f'<div class="turn {esc(role)}"><span class="role">{esc(role)}</span>{_pre(text)}</div>'
            )
    return "".join(out)


def episode_html(ep: Episode) -> str:
    """The episode's turns, final answer, outcome and model calls."""
    outcome = [
        f"<b>final answer</b>{_pre(ep.final) if ep.final is not None else ' <span class=meta>none</span>'}",
    ]
    facts = []
    if ep.score is not None or ep.passed is not None:
        facts.append(f"score {esc(number(ep.score))} {badge(ep.passed)}")
    if ep.reason:
        facts.append(f"verifier: {esc(ep.reason)}")
    if ep.stop_reason:
        facts.append(f"stop: {esc(ep.stop_reason)}")
    tokens = " · ".join(f"{esc(k)} {esc(number(v))}" for k, v in ep.tokens.items() if v is not None)
    if tokens:
        facts.append(f"tokens: {tokens}")
    if ep.error:
        facts.append(f"error: {esc(ep.error)}")
    outcome.append("<div>" + "<br>".join(facts) + "</div>")
    return (
        f'<div class="episode"><h3>{esc(ep.title)}</h3>{turns_html(ep)}'
        f'<div class="final">{"".join(outcome)}</div>{steps_table(ep.steps)}</div>'
    )


def steps_table(steps: list[dict]) -> str:
    """One row per model call of a trajectory (collapsed)."""
    if not steps:
        return ""
    head = ["call", "kind", "thread", "prompt tokens", "completion tokens", "finish", "tools", "problems"]
    rows = []
    for s in steps:
        tools = ", ".join(
            f"{t.get('name')}{'' if t.get('ok', True) else ' (' + str(t.get('error')) + ')'}"
            for t in s.get("tool_calls") or []
            if isinstance(t, dict)
        )
        keys = ("index", "kind", "thread", "prompt_tokens", "completion_tokens", "finish_reason")
        cells = [*(s.get(k) for k in keys), tools, len(s.get("problems") or [])]
        rows.append("<tr>" + "".join(f"<td>{esc(number(c))}</td>" for c in cells) + "</tr>")
    header = "".join(f"<th>{esc(h)}</th>" for h in head)
    return (
        f"<details><summary>model calls ({len(steps)})</summary>"
        f"<table><thead><tr>{header}</tr></thead><tbody>{''.join(rows)}</tbody></table></details>"
    )
