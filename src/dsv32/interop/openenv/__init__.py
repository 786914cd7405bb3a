"""OpenEnv both ways (extra ``openenv``, then ``pip install --no-deps openenv-core``).

- Serving: :func:`build_app` (``dsv32 envs serve ENV``) puts any dsv32 environment behind
  openenv-core's HTTP/WebSocket server, one sandboxed environment per session; the wire types are in
  :mod:`dsv32.interop.openenv.models`.
- Using: :class:`OpenEnvEnvironment` is a dsv32 environment that plays an OpenEnv server through
  openenv-core's client, so the agent loop and agentic GRPO run in it like in a native environment.

See docs/interop.md.
"""

from dsv32.interop.errors import require

require("openenv", "openenv", "openenv-core")

from dsv32.interop.openenv.adapter import OpenEnvEnvironment, openenv_tasks, register_openenv  # noqa: E402
from dsv32.interop.openenv.models import (  # noqa: E402
    ActionError,
    DSV32Action,
    DSV32Observation,
    DSV32State,
    ErrorCode,
)
from dsv32.interop.openenv.server import ServerThread, SessionEnvironment, TaskCatalog, build_app, serve  # noqa: E402

__all__ = [
    "ActionError",
    "DSV32Action",
    "DSV32Observation",
    "DSV32State",
    "ErrorCode",
    "OpenEnvEnvironment",
    "ServerThread",
    "SessionEnvironment",
    "TaskCatalog",
    "build_app",
    "openenv_tasks",
    "register_openenv",
    "serve",
]
