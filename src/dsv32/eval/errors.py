"""The typed error of :mod:`dsv32.eval`."""

from __future__ import annotations

from dsv32.errors import DSV32Error


class EvalError(DSV32Error, ValueError):
    """A bad benchmark name, data file, setting or run directory; the message says what to change."""
