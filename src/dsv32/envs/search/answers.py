"""How a search answer is read from the model's final text and compared with the gold answer.

1. **Extract**: the content of the last ``\\boxed{...}`` if there is one; else the text after the
   last ``Answer:`` (any case) up to the end of its line; else the whole final text.
2. **Clean**: strip whitespace, a trailing period (unless the text is a number such as ``2.``), then
   surrounding backticks.
3. **Compare as Python literals** when both sides parse with :func:`ast.literal_eval`: equal values,
   where numbers compare numerically (``2`` = ``2.0``) but a bool never equals a number
   (``True`` ≠ ``1``), and containers compare element by element under the same rule.
4. **Else compare text**: a quoted string on either side stands for its content (so ``strict``
   matches the gold ``'strict'``); both sides have runs of whitespace collapsed; a gold string
   literal is compared case-sensitively, anything else (module names, ``None``, ``True``)
   case-insensitively.
"""

from __future__ import annotations

import ast
import re

from dsv32.envs.mathcheck import last_boxed

_ANSWER = re.compile(r"answer\s*:\s*(.*)", re.IGNORECASE)


def extract(final: str) -> str:
    """The answer span of a final text (step 1 and 2 above)."""
    boxed = last_boxed(final)
    if boxed is not None:
        text = boxed
    else:
        found = None
        for line in final.splitlines():
            m = _ANSWER.search(line)
            if m:
                found = m.group(1)
        text = found if found is not None else final
    text = text.strip()
    if text.endswith(".") and not literal(text)[0]:
        text = text[:-1].rstrip()
    if len(text) >= 2 and text[0] == "`" and text[-1] == "`":
        text = text.strip("`").strip()
    return text


def literal(text: str) -> tuple[bool, object]:
    """``(True, value)`` when ``text`` is a Python literal, else ``(False, None)``."""
    try:
        return True, ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False, None


def same_value(a: object, b: object) -> bool:
    """Literal equality with numbers compared numerically and bools kept apart from numbers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _text(text: str) -> tuple[str, bool]:
    ok, value = literal(text)
    if ok and isinstance(value, str):
        return " ".join(value.split()), True
    return " ".join(text.split()), False


def matches(final: str | None, gold: str) -> bool:
    """Whether the final text answers ``gold`` (the rule in the module docstring)."""
    if final is None:
        return False
    answer = extract(final)
    if not answer:
        return False
    ok_a, va = literal(answer)
    ok_g, vg = literal(gold)
    if ok_a and ok_g and same_value(va, vg):
        return True
    got, _ = _text(answer)
    want, gold_is_str = _text(gold)
    return got == want if gold_is_str else got.casefold() == want.casefold()
