"""The typed error of :mod:`dsv32.eval`."""

from __future__ import annotations

from dsv32.errors import DSV32Error


class EvalError(DSV32Error, ValueError):
    """A bad benchmark name, data file, setting or run directory; the message says what to change."""


class RunDirectoryBusy(EvalError):
    """Another ``dsv32 eval run`` holds the run directory's lock; ``directory`` is the directory."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        super().__init__(
            f"{directory} is in use by another 'dsv32 eval run' (it holds {directory}/.lock); "
            "wait for that run to end or pass another --out"
        )
