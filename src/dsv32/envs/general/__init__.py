"""General tool tasks: task bundles (a SQLite database, tools over it, a task, a verifier) run in the
sandbox, and procedural generators for trip planning, inventory management and calendar scheduling.
Registered as ``general-tools`` on import, and the same runtime as ``synth-general`` for synthesized
sets (tasks from a set's JSONL files)."""

from dsv32.envs.base import EnvSpec, register
from dsv32.envs.general.bundle import Bundle, load_bundle, write_bundle
from dsv32.envs.general.env import GeneralToolEnv, SynthGeneralEnv
from dsv32.envs.general.tasks import TASK_SETS, generate, task_of

register(EnvSpec(GeneralToolEnv.name, GeneralToolEnv.description, GeneralToolEnv, dict(TASK_SETS)))
register(EnvSpec(SynthGeneralEnv.name, SynthGeneralEnv.description, SynthGeneralEnv, {}))

__all__ = [
    "Bundle",
    "GeneralToolEnv",
    "SynthGeneralEnv",
    "generate",
    "load_bundle",
    "task_of",
    "write_bundle",
]
