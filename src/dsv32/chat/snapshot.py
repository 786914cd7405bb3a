"""Frozen copies of messages, and comparing a message with its copy strictly.

A prompt renderer that keeps what it rendered for a message must notice when the message changes,
also in place (the caller's dict is the same object, its content is not). :func:`freeze` copies every
container and shares the leaves (strings and numbers cannot change); :func:`identical` compares a
value with its copy as a renderer sees it: equal, with the same types throughout and dict keys in the
same order (``1``, ``1.0`` and ``True`` are equal in Python but are written out differently, and so
is a dict whose keys come in another order).
"""

from __future__ import annotations

import copy
from typing import Any

_PLAIN = (str, int, float, bool, type(None))


def freeze(value: Any) -> Any:
    """A copy of ``value`` that later changes to it cannot reach: containers copied, leaves shared."""
    kind = type(value)
    if kind is dict:
        return {key: freeze(item) for key, item in value.items()}
    if kind is list:
        return [freeze(item) for item in value]
    if kind is tuple:
        return tuple(freeze(item) for item in value)
    if kind in _PLAIN:
        return value
    return copy.deepcopy(value)


def identical(a: Any, b: Any) -> bool:
    """``a == b`` with the same types throughout, dict keys in the same order and floats written the
    same (``1``, ``1.0`` and ``True`` are equal but are written differently, and so is ``-0.0``)."""
    if a is b:
        return True
    kind = type(a)
    if kind is not type(b):
        return False
    if kind is dict:
        return len(a) == len(b) and all(
            ka == kb and type(ka) is type(kb) and identical(va, vb)
            for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True)
        )
    if kind is list or kind is tuple:
        return len(a) == len(b) and all(identical(x, y) for x, y in zip(a, b, strict=True))
    if kind is float:
        return a == b and repr(a) == repr(b)
    return bool(a == b)
