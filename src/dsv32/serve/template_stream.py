"""A chat-template model's completion → OpenAI message deltas, as the text arrives.

:class:`TemplateStream` reads a reply the way :meth:`~dsv32.agent.backends.formats.TemplateFormat.parse`
(the local agent's parser) reads it whole: ``<think>…</think>`` at its start is the reasoning, the
tool calls are those of the model family's :class:`~dsv32.agent.backends.toolparsers.ToolParser`,
the rest is the content. While the text grows:

- it is read up to its *stable end*: the end minus the longest suffix that could still grow into
  ``<think>``, ``</think>`` or the parser's call markers;
- a reply opening with ``<think>`` streams its reasoning until ``</think>``; a reply that does not is
  content (with thinking on and no ``<think>``, the parser takes everything before a later
  ``</think>`` as reasoning, so such a reply is held until the end);
- content streams until the calls begin (the parser's ``start``), with leading whitespace dropped and
  trailing whitespace held back, as the parse strips them;
- a call is reported once it is complete: when the parser's ``end`` marker closes it (``hermes``), or
  at the end of the reply (``llama3_json``, ``mistral``, whose calls have no closing marker). Its
  deltas are OpenAI's: ``index``, ``id``, ``type`` and ``function.name`` with empty arguments, then
  one delta per argument fragment;
- :meth:`TemplateStream.finish` parses the whole reply and sends whatever was held back, so that the
  deltas reassemble to the parse of the whole text (a reply cut inside its reasoning, which the parse
  reads as content, is the exception: the reasoning sent stays).
"""

from __future__ import annotations

from typing import Any

from dsv32.agent.backends.formats import THINK_CLOSE, THINK_OPEN, TemplateFormat
from dsv32.serve.stream import MessageDelta, report_calls, unstable_suffix


def _grown(sent: str, now: str) -> str:
    """What ``now`` adds to ``sent`` ("" when it does not extend it)."""
    return now[len(sent) :] if now.startswith(sent) else ""


class TemplateStream:
    def __init__(self, fmt: TemplateFormat, thinking: bool) -> None:
        self.fmt, self.parser, self.thinking = fmt, fmt.tool_parser, thinking
        self.markers = tuple(m for m in (THINK_OPEN, THINK_CLOSE, self.parser.start, self.parser.end) if m)
        self.text = ""
        self.phase = "start"  # start, reasoning, content, calls; held: decided by the whole parse
        self.at = 0  # where the current phase's text begins
        self.scanned = 0  # text already looked at for the end of a call
        self.reasoning = ""
        self.content = ""
        self.calls: list[dict[str, Any]] = []

    def feed(self, piece: str) -> MessageDelta:
        self.text += piece
        delta = MessageDelta()
        self._advance(self.text[: len(self.text) - unstable_suffix(self.text, self.markers)], delta)
        return delta

    def finish(self) -> MessageDelta:
        message, _ = self.fmt.parse(self.text, self.thinking)
        delta = MessageDelta(
            _grown(self.reasoning, message.get("reasoning_content", "")),
            _grown(self.content, message["content"]),
        )
        self.reasoning += delta.reasoning
        self.content += delta.content
        report_calls(message.get("tool_calls", []), self.calls, delta)
        return delta

    def message(self) -> dict[str, Any]:
        return {
            "role": "assistant",
            "content": self.content,
            "reasoning_content": self.reasoning,
            "tool_calls": [dict(c) for c in self.calls],
        }

    def _advance(self, stable: str, delta: MessageDelta) -> None:
        if self.phase == "start":
            head = stable.lstrip()
            if head.startswith(THINK_OPEN):
                self.phase, self.at = "reasoning", stable.index(THINK_OPEN) + len(THINK_OPEN)
            elif THINK_OPEN.startswith(head):
                return  # "" or the beginning of <think>: undecided
            else:
                self.phase = "held" if self.thinking else "content"
        if self.phase == "reasoning":
            end = stable.find(THINK_CLOSE, self.at)
            delta.reasoning = _grown(self.reasoning, stable[self.at : end if end >= 0 else None].strip())
            self.reasoning += delta.reasoning
            if end < 0:
                return
            self.phase, self.at = "content", end + len(THINK_CLOSE)
        if self.phase == "content":
            region = stable[self.at :]
            begin = self.parser.calls_begin(region)
            delta.content = _grown(self.content, region[: begin if begin >= 0 else None].strip())
            self.content += delta.content
            if begin < 0:
                return
            self.phase, self.at = "calls", self.at + begin
            self.scanned = self.at
        if self.phase == "calls" and self.parser.end:
            closed = stable.find(self.parser.end, max(self.scanned - len(self.parser.end) + 1, self.at)) >= 0
            self.scanned = len(stable)
            if closed:
                _, calls, _ = self.parser.parse(stable[self.at :])
                report_calls(calls, self.calls, delta)
