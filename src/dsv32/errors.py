"""The root of the project's typed errors.

Every package raises its own subclass of :class:`DSV32Error` for input a user can fix (a bad config,
a malformed conversation, an unknown model name, a broken recipe). The ``dsv32`` command prints such
an error as one line and exits with code 2; anything else is a bug and keeps its traceback.
This module imports nothing, so every package, however low, may use it.
"""

from __future__ import annotations


class DSV32Error(Exception):
    """Bad input, described in a message that says what is wrong and what to do."""
