"""The interop package's typed errors, and the check that an optional library is installed."""

from __future__ import annotations

import importlib.util

from dsv32.envs.base import EnvError


class InteropError(EnvError):
    """A bad request to or from another framework's environment: an unknown task, a server that
    refuses the session, a reply that does not fit its protocol. An :class:`~dsv32.envs.EnvError`, so
    the agent loop and the trainers treat it as the environment's failure, not the model's."""


class MissingExtraError(InteropError, ImportError):
    """The optional library an interop module needs is not installed."""


def require(module: str, extra: str, distribution: str) -> None:
    """Raise :class:`MissingExtraError` saying how to install ``module`` when it is absent: the extra
    holds what the library imports, the library itself goes in without its own pins (docs/interop.md)."""
    if importlib.util.find_spec(module) is None:
        raise MissingExtraError(
            f"{distribution} is not installed: pip install 'dsv32[{extra}]' && pip install --no-deps "
            f"{distribution} (docs/interop.md says why)"
        )
