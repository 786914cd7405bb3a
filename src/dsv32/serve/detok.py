"""Token ids → text as they are generated, with stop strings.

:class:`IncrementalText` decodes a growing list of ids the way vLLM does: the new text is the decode of
a short window of recent ids minus the decode of the same window without the newest ones, and text
ending in an incomplete UTF-8 sequence (``\\ufffd``) waits for the next token. That keeps
tokenizers whose decoding depends on neighbouring tokens (leading spaces, byte fallback) exact.

Stop strings: the text is cut just before the first occurrence of any stop string, and while the
completion runs the last ``max(len(stop)) - 1`` characters are held back so that no text after a stop
string is ever released.
"""

from __future__ import annotations


class IncrementalText:
    """Decode ids one at a time; release text that no later token or stop string can change."""

    def __init__(self, tokenizer, *, skip_special_tokens: bool, stops: list[str] | None = None) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.stops = list(stops or [])
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.text = ""  # everything decoded (cut at a stop string once one appears)
        self.released = 0  # characters of ``text`` handed out
        self.stopped = False

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def push(self, token_id: int) -> str:
        """Add one token; return the newly released text ("" while held back or after a stop)."""
        if self.stopped:
            return ""
        self.ids.append(int(token_id))
        before = self._decode(self.ids[self.prefix_offset : self.read_offset])
        after = self._decode(self.ids[self.prefix_offset :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            start = len(self.text)
            self.text += after[len(before) :]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            self._find_stop(start)
        end = len(self.text) if self.stopped else max(self.released, len(self.text) - self.hold)
        return self._release(end)

    def flush(self) -> str:
        """The held-back text, at the end of the completion."""
        return self._release(len(self.text))

    def _find_stop(self, start: int) -> None:
        lo = max(0, start - self.hold)
        hits = [i for i in (self.text.find(s, lo) for s in self.stops) if i >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            self.stopped = True

    def _release(self, end: int) -> str:
        piece = self.text[self.released : end]
        self.released = max(self.released, end)
        return piece
