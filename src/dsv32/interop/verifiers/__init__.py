"""verifiers both ways (extra ``verifiers``, then ``pip install --no-deps verifiers``;
verifiers' v1 API).

- The dsv32 environments as a verifiers taskset: :func:`load_environment` and the taskset id
  ``dsv32-envs`` (the plugin module ``dsv32_envs``, which verifiers imports by that id):
  :class:`DSV32Taskset`, :class:`DSV32Task` (the environment's tools as a per-rollout MCP server, the
  dsv32 verifier as its reward) and :class:`DSV32Harness` (verifiers' chat loop with those tools).
- A verifiers taskset as a dsv32 environment: :class:`VerifiersEnvironment` (:func:`register_verifiers`
  names one for ``get_env``).

See docs/interop.md.
"""

from dsv32.interop.errors import require

require("verifiers", "verifiers", "verifiers")

from dsv32.interop.verifiers.adapter import VerifiersEnvironment, open_taskset, register_verifiers  # noqa: E402
from dsv32.interop.verifiers.messages import to_openai, to_verifiers, trace_of  # noqa: E402
from dsv32.interop.verifiers.taskset import (  # noqa: E402
    TASKSET_ID,
    DSV32Data,
    DSV32Harness,
    DSV32Task,
    DSV32TaskConfig,
    DSV32Taskset,
    DSV32TasksetConfig,
    load_environment,
    score_messages,
)
from dsv32.interop.verifiers.toolset import DSV32Toolset, DSV32ToolsetConfig  # noqa: E402

__all__ = [
    "TASKSET_ID",
    "DSV32Data",
    "DSV32Harness",
    "DSV32Task",
    "DSV32TaskConfig",
    "DSV32Taskset",
    "DSV32TasksetConfig",
    "DSV32Toolset",
    "DSV32ToolsetConfig",
    "VerifiersEnvironment",
    "load_environment",
    "open_taskset",
    "register_verifiers",
    "score_messages",
    "to_openai",
    "to_verifiers",
    "trace_of",
]
