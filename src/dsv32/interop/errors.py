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


def require(module: str, extra: str) -> None:
    """Raise :class:`MissingExtraError` naming the extra to install when ``module`` is absent."""
    if importlib.util.find_spec(module) is None:
        raise MissingExtraError(
            f"{module!r} is not installed: pip install 'dsv32[{extra}]' (see docs/interop.md)"
        )
