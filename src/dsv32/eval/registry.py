"""The benchmarks ``dsv32 eval`` knows, by name.

Fixed ones (:data:`BUILTIN`) and one ``agent-<env>`` per environment registered in
:mod:`dsv32.envs` (``agent-code-interpreter``, ``agent-search``, ...), so an environment registered
later is a benchmark too. Modules are imported only when their benchmark is asked for.
"""

from __future__ import annotations

import importlib

from dsv32.eval.errors import EvalError
from dsv32.eval.types import Benchmark

#: name → "module:class" under dsv32.eval
BUILTIN = {
    "humaneval": "humaneval:HumanEval",
    "bfcl": "bfcl.single:BFCL",
    "bfcl-multi-turn": "bfcl.multi_turn:BFCLMultiTurn",
    "reasoning-gym": "rgym:ReasoningGym",
    "byo-boxed": "byo:Boxed",
    "byo-mcq": "byo:MultipleChoice",
    "byo-swe": "byo:SweBench",
}


def names() -> list[str]:
    from dsv32.eval.agentic import PREFIX, env_names

    return [*BUILTIN, *(PREFIX + e for e in env_names())]


def get(name: str) -> Benchmark:
    """A fresh instance of benchmark ``name``."""
    from dsv32.eval.agentic import PREFIX, Agentic, env_names

    if name in BUILTIN:
        module, cls = BUILTIN[name].split(":")
        return getattr(importlib.import_module(f"dsv32.eval.{module}"), cls)()
    if name.startswith(PREFIX) and name[len(PREFIX) :] in env_names():
        return Agentic(name[len(PREFIX) :])
    raise EvalError(f"unknown benchmark {name!r}; known: {', '.join(names())} (see 'dsv32 eval list')")
