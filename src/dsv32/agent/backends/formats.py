"""Prompt formats of the local backend: the V3.2 encoding, or a model's own chat template.

:class:`V32Format` (a tokenizer with the V3.2 special tokens): the prompt is exactly
:func:`dsv32.chat.encode_messages` of the conversation with its tools attached, grown incrementally by
a :class:`dsv32.chat.IncrementalEncoder`: a step renders only the messages it adds (a new user message
re-renders from the previous one, §3.2.1 changes their layout; a rewritten history from its first
change). The ids are kept in pieces that end where a special token ends a message's text or starts
the next one's (a tokenizer splits at special tokens first, so each piece tokenizes on its own as it
does inside the whole prompt); a step tokenizes the pieces from the first changed message on.
Completions are parsed with :func:`dsv32.chat.parse_completion` in lenient mode; its problems are
returned.

:class:`TemplateFormat` (any other chat model): the tokenizer's ``apply_chat_template``. Tool calls
are written and read in the format of the model's family (:mod:`dsv32.agent.backends.toolparsers`:
``hermes``' ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` by default and for templates
that know no tools, ``llama3_json``, ``mistral``; ``tool_parser`` names one). For a template that
ignores ``tools`` (SmolLM2's does) the tool schemas are added to the system message with instructions
in that format; for one that ignores assistant ``tool_calls`` the calls are written into the
assistant's content in the same form, so the model sees what it did. The server
(:mod:`dsv32.serve`) renders and parses a chat template's requests with this same class. Reasoning inside ``<think>…</think>`` becomes ``reasoning_content``; the reasoning
§3.2.1 keeps (thinking mode, the turns after the last user message) is given to the template in the
field it renders (:data:`REASONING_FIELDS`, probed once) or, when it renders none, written before the
content as ``<think>\\nreasoning\\n</think>\\n\\n``, which :meth:`TemplateFormat.parse` reads back as
the same message. A template that refuses ``tool`` turns (or leaves them out) gets tool results as
user turns (:func:`results_as_user`), probed once. The template is rendered whole at each step (it
may depend on the whole conversation; a call with the same conversation as the previous one returns
the previous prompt), and tokenized in pieces by a :class:`PieceTokenizer`, which tokenizes only what
changed.

Tool results are untrusted text: both formats remove special-token strings from them before the
prompt is tokenized (:func:`dsv32.chat.strip_tool_results`) — the V3.2 special tokens, or the
template tokenizer's own special tokens (``<|im_start|>``, ...) — so a tool cannot open a turn of
its own. The messages themselves are not changed.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dsv32.agent.backends.base import assistant_message, visible_messages
from dsv32.agent.backends.toolparsers import ToolParser
from dsv32.agent.backends.toolparsers import tool_parser as make_parser
from dsv32.agent.errors import AgentError
from dsv32.chat import (
    EOS,
    SPECIAL_TOKENS,
    THINK_END,
    IncrementalEncoder,
    Segment,
    ToolResultStripper,
    attach_tools,
    missing_special_tokens,
    parse_completion,
    strip_tool_results,
    tokenizer_special_tokens,
)
from dsv32.chat.protocol import CALLS_START
from dsv32.chat.snapshot import freeze, identical


def _strip_tool_result(message: dict) -> dict:
    return strip_tool_results([message])[0]


def _cut_between(before: str, after: str) -> bool:
    """Whether text ending with ``before`` and text starting with ``after`` tokenize on their own as
    they do together: a special token stands between them (a tokenizer splits the text at its
    special tokens before anything else)."""
    return before.endswith(SPECIAL_TOKENS) or after.startswith(SPECIAL_TOKENS)


@dataclass
class Prompt:
    messages: list[dict]
    tools: list[dict]
    thinking: bool
    text: str
    ids: list[int]


class V32Format:
    name = "v32"

    def __init__(self, tokenizer: Any) -> None:
        missing = missing_special_tokens(tokenizer) if hasattr(tokenizer, "get_added_vocab") else ["all"]
        if missing:
            raise AgentError(
                f"the tokenizer lacks the V3.2 special tokens {missing}: call "
                "dsv32.chat.add_v32_special_tokens(tokenizer) and resize the model's embeddings, or use "
                "format='template' (the model's own chat template)"
            )
        self.tokenizer = tokenizer
        self.stop_ids = [tokenizer.convert_tokens_to_ids(EOS)]
        self.last: Prompt | None = None
        self._encoder: IncrementalEncoder | None = None
        self._segments: list[Segment] = []
        # where the prompt can be cut for tokenizing the rest on its own (a special token on one
        # side): (segments, characters, ids) before each such place, in order
        self._cuts: list[tuple[int, int, int]] = [(0, 0, 0)]

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt(self, messages: Sequence[dict], tools: Sequence[dict], thinking: bool) -> Prompt:
        mode = "thinking" if thinking else "chat"
        tools, messages = list(tools), list(messages)
        if self._encoder is None or self._encoder.thinking_mode != mode:
            self._encoder = IncrementalEncoder(mode, prepare=_strip_tool_result)
            self._segments, self._cuts, self.last = [], [(0, 0, 0)], None
        segments = self._encoder.segments(attach_tools(messages[:1], tools) + messages[1:])
        reused = self._encoder.reused
        last = self.last
        if last is not None and reused == len(segments) == len(self._segments):
            if last.tools != tools or last.messages != messages:
                last = self.last = Prompt(messages, tools, thinking, last.text, last.ids)
            return last
        try:
            self.last = self._tokenize(segments, reused, messages, tools, thinking)
        except BaseException:
            self._encoder = None  # its state is ahead of the ids kept here: start over next time
            raise
        return self.last

    def _tokenize(
        self, segments: list[Segment], reused: int, messages: list[dict], tools: list[dict], thinking: bool
    ) -> Prompt:
        """The prompt of ``segments``, of which the first ``reused`` are those of the last prompt:
        restart at the last cut within them and tokenize from there, piece by piece."""
        last = self.last
        keep = bisect.bisect_right(self._cuts, reused, key=lambda cut: cut[0]) - 1
        cuts = self._cuts[: keep + 1]
        first, chars, count = cuts[-1]
        pieces, ids = [], last.ids[:count] if last is not None else []
        chunk: list[str] = []
        for index in range(first, len(segments)):
            chunk.append(segments[index].text)
            end = index + 1 == len(segments)
            if end or _cut_between(segments[index].text, segments[index + 1].text):
                piece = "".join(chunk)
                chunk = []
                pieces.append(piece)
                chars += len(piece)
                ids += self._ids(piece)
                if not end or piece.endswith(SPECIAL_TOKENS):
                    cuts.append((index + 1, chars, len(ids)))
        text = (last.text[: cuts[keep][1]] if last is not None else "") + "".join(pieces)
        self._segments, self._cuts = segments, cuts
        return Prompt(messages, tools, thinking, text, ids)

    def decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=False)

    def parse(self, text: str, thinking: bool) -> tuple[dict, list[dict]]:
        parsed = parse_completion(text, "thinking" if thinking else "chat", strict=False)
        message = assistant_message(parsed["content"], parsed["reasoning_content"], parsed["tool_calls"])
        return message, parsed["problems"]

    #: streaming: reasoning until think_end (thinking mode), content until calls_start
    think_start, think_end, calls_start = None, THINK_END, CALLS_START


# ------------------------------------------------------------------------------------------ templates
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
#: assistant fields that chat templates render reasoning from, in the order they are tried
REASONING_FIELDS = ("reasoning_content", "reasoning", "thinking")
_THINK = re.compile(r"^\s*(?:<think>)?(.*?)</think>", re.S)
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
_PROBE = "dsv32_probe_function"
_PROBE_RESULT = "dsv32_probe_result"


def results_as_user(messages: Sequence[dict]) -> list[dict]:
    """``messages`` with tool results as user turns, for a template that refuses ``tool`` turns: each
    result is written ``<tool_response>\n…\n</tool_response>``, and the results of one step, with a
    user message right after them, make one user turn (joined by a newline; a template that checks
    that roles alternate accepts it)."""
    out: list[dict] = []
    merged = False  # whether out[-1] is a user turn made of tool results
    for message in messages:
        role = message.get("role")
        if role == "tool":
            text = f"{TOOL_RESPONSE_OPEN}\n{message.get('content') or ''}\n{TOOL_RESPONSE_CLOSE}"
        elif role == "user" and merged:
            text = message.get("content") or ""
        else:
            out.append(message)
            merged = False
            continue
        if merged:
            out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + text}
        else:
            out.append({"role": "user", "content": text})
        merged = True
    return out


def split_markers(tokenizer: Any) -> list[str]:
    """The special tokens of ``tokenizer`` that its text is split at before anything else, as they
    are written: added tokens marked special that match as they are (not normalized, no whitespace
    taken on their left, not only as whole words)."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return sorted(
        token.content
        for token in added.values()
        if getattr(token, "special", False)
        and token.content
        and not getattr(token, "lstrip", False)
        and not getattr(token, "single_word", False)
        and not getattr(token, "normalized", False)
    )


class PieceTokenizer:
    """Token ids of a text that changes little from one call to the next (a re-rendered prompt).

    The ids are kept in pieces: the text is cut where one of ``markers`` begins (special tokens a
    tokenizer splits the text at before anything else, see :func:`split_markers`), so a piece ends
    where the tokenizer's own split falls and tokenizes on its own as it does inside the whole text;
    the text before a marker never merges with it, and the text after it starts a new section either
    way. A call reuses the pieces of the previous text that the new text still holds whole, each
    followed by the same marker, and tokenizes only the rest, piece by piece. Without markers every
    call tokenizes the whole text.
    """

    def __init__(self, tokenizer: Any, markers: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        markers = sorted(set(markers), key=len, reverse=True)
        self.pattern = re.compile("|".join(map(re.escape, markers))) if markers else None
        self.text = ""
        # per piece: where it starts in the text, the length of the marker it starts with (0 for a
        # first piece without one), and how many ids come before it
        self.starts: list[int] = []
        self.heads: list[int] = []
        self.counts: list[int] = []
        self.ids: list[int] = []
        self.tokenized = 0  # characters tokenized by the latest call

    def _encode(self, texts: list[str]) -> list[list[int]]:
        if len(texts) == 1:
            return [list(self.tokenizer.encode(texts[0], add_special_tokens=False))]
        return [list(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def _kept(self, text: str) -> int:
        """How many leading pieces of the previous text ``text`` holds whole, each still followed by
        the marker that followed it."""
        old, starts, heads = self.text, self.starts, self.heads
        if len(starts) < 2:
            return 0
        if text.startswith(old):
            return len(starts) - 1  # all but the last, which nothing followed
        kept = 0
        for j in range(1, len(starts)):
            end = starts[j] + heads[j]
            if not text.startswith(old[starts[j - 1] : end], starts[j - 1]):
                break
            kept = j
        return kept

    def __call__(self, text: str) -> list[int]:
        """The ids of ``text`` (a new list; equal to tokenizing it whole)."""
        if self.pattern is None:
            self.tokenized = len(text)
            return self._encode([text])[0]
        kept = self._kept(text)
        start = self.starts[kept] if kept else 0
        cuts = [start] + [m.start() for m in self.pattern.finditer(text, start) if m.start() > start]
        pieces = [text[a:b] for a, b in zip(cuts, [*cuts[1:], len(text)], strict=True)]
        ids = self.ids[: self.counts[kept]] if kept else []
        starts, heads, counts = self.starts[:kept], self.heads[:kept], self.counts[:kept]
        for at, piece, piece_ids in zip(cuts, pieces, self._encode(pieces), strict=True):
            head = self.pattern.match(piece)
            starts.append(at)
            heads.append(head.end() if head else 0)
            counts.append(len(ids))
            ids += piece_ids
        self.text, self.starts, self.heads, self.counts, self.ids = text, starts, heads, counts, ids
        self.tokenized = len(text) - start
        return list(ids)


class TemplateFormat:
    name = "template"

    def __init__(
        self,
        tokenizer: Any,
        stop_ids: Sequence[int],
        template_kwargs: dict | None = None,
        tool_parser: str | None = None,
    ) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise AgentError(
                "the tokenizer has no chat template and lacks the V3.2 special tokens: add them with "
                "dsv32.chat.add_v32_special_tokens (and resize the embeddings) or give it a chat_template"
            )
        self.tokenizer = tokenizer
        self.stop_ids = list(stop_ids)
        self.template_kwargs = dict(template_kwargs or {})
        #: how this model family writes tool calls (see dsv32.agent.backends.toolparsers)
        self.tool_parser: ToolParser = make_parser(tool_parser, tokenizer.chat_template)
        self.special_tokens = tokenizer_special_tokens(tokenizer)
        probe_tool = {"type": "function", "function": {"name": _PROBE, "parameters": {"type": "object"}}}
        user = {"role": "user", "content": "hi"}
        call = {"type": "function", "function": {"name": _PROBE, "arguments": {}}}
        self.renders_tools = _PROBE in self._render([user], [probe_tool], probe=True)
        calling = {"role": "assistant", "content": "", "tool_calls": [{**call, "id": "call_0"}]}
        result = {"role": "tool", "tool_call_id": "call_0", "content": _PROBE_RESULT}
        #: whether the template renders ``tool`` turns; when it refuses them (an alternation check)
        #: or leaves them out, tool results are given to it as user turns (see results_as_user)
        self.tool_role = any(
            _PROBE_RESULT in self._render(probe, [], probe=True)
            for probe in ([user, calling, result], [user, {"role": "assistant", "content": "ok"}, result])
        )
        turn = [user, calling, result] if self.tool_role else [user, calling, *results_as_user([result])]
        self.renders_calls = _PROBE in self._render(turn, [], probe=True)
        #: the assistant field this template renders reasoning from, or None: reasoning is written
        #: into the content as ``<think>\n…\n</think>\n\n`` (what :meth:`parse` reads back)
        self.reasoning_field = self._probe_reasoning_field(user)
        self.last: Prompt | None = None
        self._seen: Any = None  # a frozen copy of the latest call's (thinking, tools, messages)
        self._strip = ToolResultStripper(self.special_tokens)
        #: where prompts are cut for tokenizing them in pieces (see PieceTokenizer)
        self.markers = split_markers(tokenizer)
        self.pieces = PieceTokenizer(tokenizer, self.markers)
        self._check_pieces(turn)

    def _probe_reasoning_field(self, user: dict) -> str | None:
        for field in REASONING_FIELDS:
            reply = {"role": "assistant", "content": "ok", field: _PROBE}
            if _PROBE in self._render([user, reply], [], probe=True, enable_thinking=True):
                return field
        return None

    def _render(self, messages: list[dict], tools: list[dict], probe: bool = False, **kwargs: Any) -> str:
        import jinja2

        try:
            return self.tokenizer.apply_chat_template(
                messages,
                tools=tools or None,
                add_generation_prompt=True,
                tokenize=False,
                **{**kwargs, **self.template_kwargs},
            )
        except (jinja2.TemplateError, TypeError, KeyError, ValueError) as err:
            if probe:
                return ""
            raise AgentError(f"the model's chat template cannot render this conversation: {err}") from err

    def _check_pieces(self, turn: list[dict]) -> None:
        """Tokenize rendered conversations in pieces as prompts are (growing, then with an earlier
        message changed); if the ids differ from tokenizing the whole text, tokenize whole texts."""
        user = {"role": "user", "content": " next 2"}
        grown = [*turn, {"role": "assistant", "content": "x y"}, user]
        changed = [turn[0], {"role": "assistant", "content": "z"}, user]
        probe = PieceTokenizer(self.tokenizer, self.markers)
        for messages in (turn[:1], turn, grown, changed):
            text = self._render(messages, [], probe=True)
            if text and probe(text) != list(self.tokenizer.encode(text, add_special_tokens=False)):
                self.markers = []
                self.pieces = PieceTokenizer(self.tokenizer)
                return

    def template_messages(
        self, messages: Sequence[dict], tools: Sequence[dict], thinking: bool
    ) -> list[dict]:
        """The conversation as this template gets it (see the module docstring)."""
        out = self._strip(visible_messages(messages, thinking))
        for message in out:
            if message.get("role") != "assistant":
                continue
            if message.get("tool_calls") and not self.renders_calls:
                blocks = [self.tool_parser.render(c) for c in message.pop("tool_calls")]
                message["content"] = "\n".join(
                    [message["content"], *blocks] if message.get("content") else blocks
                )
            reasoning = message.get("reasoning_content")
            if reasoning and self.reasoning_field != "reasoning_content":
                del message["reasoning_content"]
                if self.reasoning_field is not None:
                    message[self.reasoning_field] = reasoning
                else:
                    message["content"] = f"{THINK_OPEN}\n{reasoning}\n{THINK_CLOSE}\n\n" + (
                        message.get("content") or ""
                    )
        if not self.tool_role:
            out = results_as_user(out)
        if tools and not self.renders_tools:
            block = self.tool_parser.instructions(tools)
            if out and out[0].get("role") == "system":
                out[0]["content"] = (out[0].get("content") or "") + "\n\n" + block
            else:
                out.insert(0, {"role": "system", "content": block})
        return out

    def prompt(
        self,
        messages: Sequence[dict],
        tools: Sequence[dict],
        thinking: bool,
        template_kwargs: dict | None = None,
    ) -> Prompt:
        """The prompt of ``messages`` with ``tools``; ``template_kwargs`` are this call's variables for
        the template (a server request's ``chat_template_kwargs``; the backend's own ``template_kwargs``
        win over them)."""
        tools, messages = list(tools), list(messages)
        last, seen = self.last, (thinking, tools, messages, template_kwargs)
        if last is not None and last.messages == messages and identical(seen, self._seen):
            return last  # the same conversation again (count_tokens, then complete)
        shown = self.template_messages(messages, tools, thinking)
        kwargs = {"enable_thinking": thinking, **(template_kwargs or {})}
        text = self._render(shown, tools if self.renders_tools else [], **kwargs)
        last = self.last
        if last is not None and last.text == text:
            ids = last.ids
        else:
            try:
                ids = self.pieces(text)
            except BaseException:
                self.pieces = PieceTokenizer(self.tokenizer, self.markers)  # start over next time
                raise
        self._seen = freeze(seen)
        self.last = Prompt(messages, tools, thinking, text, ids)
        return self.last

    def decode(self, tokens: Sequence[int]) -> str:
        body = list(tokens)
        if body and body[-1] in self.stop_ids:
            body = body[:-1]
        return self.tokenizer.decode(body, skip_special_tokens=False)

    def parse(self, text: str, thinking: bool) -> tuple[dict, list[dict]]:
        reasoning = ""
        match = _THINK.match(text)
        if match and (text.lstrip().startswith(THINK_OPEN) or thinking):
            reasoning, text = match.group(1).strip(), text[match.end() :]
        content, calls, problems = self.tool_parser.parse(text)
        return assistant_message(content.strip(), reasoning, calls), problems

    #: streaming: a reply that opens with think_start reasons until think_end; content until calls_start
    think_start, think_end = THINK_OPEN, THINK_CLOSE

    @property
    def calls_start(self) -> str:
        return self.tool_parser.start
