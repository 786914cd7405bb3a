"""Completion text → OpenAI message deltas, as the text arrives.

:class:`V32Stream` turns a V3.2 completion (the text generated after the prompt) into
``reasoning_content``, ``content`` and ``tool_calls`` deltas while it is being generated. Whatever
the split of the text into pieces, the deltas reassemble to exactly what
``parse_completion(text, mode, strict=False)`` gives on the whole text:

- each piece is appended to the text seen so far; the text is parsed (leniently) up to its *stable
  end*: the end minus the longest suffix that could still grow into ``</think>``, the tool-call block
  opener ``\\n\\n<｜DSML｜function_calls>`` or ``<｜end▁of▁sentence｜>``, the markers that end the
  reasoning and the content. Reasoning and content of that stable text only ever grow by appending,
  so the delta is the new suffix. While no marker has closed the field the text ends in (reasoning,
  or content before any tool-call block or end token), new stable text without a marker is appended
  to that field as it is, without parsing the whole text again: a long answer costs linear time;
- once a tool-call block or the end token began, reasoning and content are final and the parse only
  gains a call when an ``invoke`` closes, so the text is parsed again only when new stable text
  closes one (a long reasoning is not re-read for every piece of the calls);
- a tool call is reported once its ``invoke`` is closed: lenient parsing of a text cut inside a call
  keeps only the calls completed before it, so a call cut at ``max_tokens`` is never reported, and
  one that is reported never changes. It is sent as OpenAI streams calls: a delta with ``index``,
  ``id`` (``call_…``), ``type`` and ``function.name`` and empty arguments, then one delta per
  argument fragment (``{"key": value`` per parameter, ``}``), whose concatenation is the JSON string
  ``parse_completion`` writes;
- :meth:`V32Stream.finish` parses the whole text and sends what was held back.

:class:`PlainStream` is the same interface for models without the V3.2 format: everything is content.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from dsv32.chat import parse_completion
from dsv32.chat import protocol as P

#: The markers a stable prefix may not end inside of.
MARKERS = (P.THINK_END, P.CALLS_START, P.EOS)


def new_call_id() -> str:
    """An OpenAI-style tool call id."""
    return f"call_{uuid.uuid4().hex[:24]}"


def unstable_suffix(text: str, markers: tuple[str, ...] = MARKERS) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of one of ``markers``."""
    best = 0
    for marker in markers:
        tail = text[max(0, len(text) - len(marker) + 1) :]
        i = tail.find(marker[0])
        while i >= 0 and not marker.startswith(tail[i:]):
            i = tail.find(marker[0], i + 1)
        if i >= 0:
            best = max(best, len(tail) - i)
    return best


def argument_fragments(arguments: str) -> list[str]:
    """``'{"a": 1, "b": "x"}'`` → ``['{"a": 1', ', "b": "x"', '}']`` (one fragment per parameter)."""
    parsed = json.loads(arguments)
    if not parsed:
        return [arguments]
    pairs = [
        f"{json.dumps(k, ensure_ascii=False)}: {json.dumps(v, ensure_ascii=False)}" for k, v in parsed.items()
    ]
    fragments = ["{" + pairs[0], *(", " + p for p in pairs[1:]), "}"]
    return fragments if "".join(fragments) == arguments else [arguments]


@dataclass
class MessageDelta:
    """What one piece of text added: reasoning and content text, and OpenAI tool-call deltas."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)


class V32Stream:
    """Incremental V3.2 completion parser (see the module docstring). ``thinking_mode``: ``"thinking"``
    when the prompt ended with ``<think>``, else ``"chat"``."""

    def __init__(self, thinking_mode: str = "thinking") -> None:
        self.mode = thinking_mode
        self.text = ""
        self.parsed = 0  # length of the text parsed so far
        self.open_field: str | None = None  # "reasoning" / "content" while no marker closed it
        self.in_calls = False  # a tool-call block or the end token began (at the last parse)
        self.reasoning = ""
        self.content = ""
        self.calls: list[dict[str, Any]] = []  # reported calls, with ids

    def feed(self, piece: str) -> MessageDelta:
        self.text += piece
        return self._advance(len(self.text) - unstable_suffix(self.text))

    def finish(self) -> MessageDelta:
        """Everything still held back; afterwards :meth:`message` is the parse of the whole text."""
        return self._advance(len(self.text), final=True)

    def message(self) -> dict[str, Any]:
        """The assistant message reported so far (OpenAI shape; ``tool_calls`` with ids)."""
        return {
            "role": "assistant",
            "content": self.content,
            "reasoning_content": self.reasoning,
            "tool_calls": [dict(c) for c in self.calls],
        }

    def _advance(self, end: int, final: bool = False) -> MessageDelta:
        """Parse the text up to ``end`` (a stable end, or the end of the text when ``final``)."""
        start, self.parsed = self.parsed, end
        if end == start and not (final and self.in_calls):
            return MessageDelta()
        if self.in_calls and not final and not _has_marker(self.text, start, end, (P.INVOKE_CLOSE,)):
            return MessageDelta()
        if self.open_field and not _has_marker(self.text, start, end):
            new = self.text[start:end]
            if self.open_field == "reasoning":
                self.reasoning += new
                return MessageDelta(reasoning=new)
            self.content += new
            return MessageDelta(content=new)
        text = self.text[:end]
        self.open_field = _open_field(text, self.mode)
        self.in_calls = self.open_field is None
        parsed = parse_completion(text, self.mode, strict=False)
        reasoning, content = parsed["reasoning_content"], parsed["content"]
        if not (reasoning.startswith(self.reasoning) and content.startswith(self.content)):
            raise AssertionError(f"non-monotone parse of a growing completion: {text!r}")
        delta = MessageDelta(reasoning[len(self.reasoning) :], content[len(self.content) :])
        self.reasoning, self.content = reasoning, content
        report_calls(parsed["tool_calls"], self.calls, delta)
        return delta


def report_calls(calls: list[dict], sent: list[dict], delta: MessageDelta) -> None:
    """Append to ``delta`` the calls of ``calls`` beyond the ``len(sent)`` already streamed (each with a
    new id, its name, then its arguments in fragments), and record them in ``sent``. Arguments that
    are not a JSON object go out whole."""
    for call in calls[len(sent) :]:
        index, name, arguments = len(sent), call["function"]["name"], call["function"]["arguments"]
        call_id = new_call_id()
        sent.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
        delta.tool_calls.append(
            {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
        )
        try:
            fragments = argument_fragments(arguments)
        except (ValueError, AttributeError):
            fragments = [arguments]
        delta.tool_calls += [{"index": index, "function": {"arguments": f}} for f in fragments]


def _has_marker(text: str, start: int, end: int, markers: tuple[str, ...] = MARKERS) -> bool:
    """Whether one of ``markers`` lies in ``text[:end]`` and ends after ``start``."""
    return any(text.find(m, max(0, start - len(m) + 1), end) >= 0 for m in markers)


def _open_field(text: str, mode: str) -> str | None:
    """The field that more text without markers extends: the reasoning until ``</think>``, then the
    content; None once a tool-call block or the end token began."""
    if P.CALLS_START in text or P.EOS in text:
        return None
    return "reasoning" if mode == "thinking" and P.THINK_END not in text else "content"


class PlainStream:
    """A model without the V3.2 format: the completion is the content."""

    def __init__(self) -> None:
        self.content = ""

    def feed(self, piece: str) -> MessageDelta:
        self.content += piece
        return MessageDelta(content=piece)

    def finish(self) -> MessageDelta:
        return MessageDelta()

    def message(self) -> dict[str, Any]:
        return {"role": "assistant", "content": self.content, "reasoning_content": "", "tool_calls": []}


def reassemble(deltas: list[MessageDelta]) -> dict[str, Any]:
    """The message a client rebuilds from ``deltas`` (tool calls by ``index``, arguments concatenated)."""
    calls: dict[int, dict[str, Any]] = {}
    for d in deltas:
        for tc in d.tool_calls:
            call = calls.setdefault(
                tc["index"], {"type": "function", "function": {"name": "", "arguments": ""}}
            )
            if "id" in tc:
                call["id"] = tc["id"]
            call["function"]["name"] += tc["function"].get("name", "")
            call["function"]["arguments"] += tc["function"].get("arguments", "")
    return {
        "role": "assistant",
        "content": "".join(d.content for d in deltas),
        "reasoning_content": "".join(d.reasoning for d in deltas),
        "tool_calls": [calls[i] for i in sorted(calls)],
    }
