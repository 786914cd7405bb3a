"""Interoperability: dsv32 environments in other frameworks' protocols, and theirs inside dsv32.

- :mod:`dsv32.interop.openenv` (extra ``openenv``): any dsv32 environment served over OpenEnv's
  HTTP/WebSocket protocol (``dsv32 envs serve``), and :class:`OpenEnvEnvironment`, an OpenEnv server
  as a dsv32 environment for the agent loop and agentic GRPO.
- :mod:`dsv32.interop.verifiers` (extra ``verifiers``): the dsv32 environments as a verifiers taskset
  (``load_environment``; the plugin module ``dsv32_envs``), and :class:`VerifiersEnvironment`, a
  verifiers taskset as a dsv32 environment.

This package sits above ``agent`` and ``envs`` and below ``cli``. Importing it needs neither library;
each subpackage says which extra to install when its library is missing. See docs/interop.md.
"""

from dsv32.interop.errors import InteropError, MissingExtraError

__all__ = ["InteropError", "MissingExtraError"]
