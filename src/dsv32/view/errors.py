"""The view's typed error."""

from __future__ import annotations

from dsv32.errors import DSV32Error


class ViewError(DSV32Error, ValueError):
    """A path that is none of the things ``dsv32 view`` shows, or a file of one that cannot be read."""
