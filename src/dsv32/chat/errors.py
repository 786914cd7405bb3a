"""Typed errors of the chat protocol. Both are ``ValueError`` subclasses."""

from __future__ import annotations

from dsv32.errors import DSV32Error


class ConversationError(DSV32Error, ValueError):
    """A message list that cannot be encoded.

    ``index`` is the position of the offending message in the full conversation (``context`` +
    ``messages``), or ``None`` when the problem is not tied to one message.
    """

    def __init__(self, index: int | None, problem: str) -> None:
        self.index = index
        self.problem = problem
        where = f"message {index}" if index is not None else "conversation"
        super().__init__(f"{where}: {problem}")


class ParseError(DSV32Error, ValueError):
    """A completion that is not one well-formed assistant turn.

    ``position`` is the character offset in the completion text where parsing failed and
    ``expected`` says what the parser was looking for there; ``found`` is a short excerpt of the text
    at that position (empty at the end of the text). ``part`` is the part of the turn being read:
    ``"reasoning"``, ``"content"``, ``"tool_calls"`` (the DSML block), ``"arguments"`` (a value of a
    call that is still read) or ``"end"`` (the end token).
    """

    def __init__(self, position: int, expected: str, found: str = "", part: str | None = None) -> None:
        self.position = position
        self.expected = expected
        self.found = found
        self.part = part
        at = f"found {found!r}" if found else "found the end of the text"
        super().__init__(f"at position {position}: expected {expected}, {at}")

    def as_dict(self) -> dict[str, object]:
        """A JSON-friendly record (what lenient parsing lists under ``problems``)."""
        record: dict[str, object] = {
            "position": self.position,
            "expected": self.expected,
            "message": str(self),
        }
        if self.part is not None:
            record["part"] = self.part
        return record
