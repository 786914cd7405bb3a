"""The code-interpreter environment: a sandboxed Jupyter kernel per episode, math tasks with exact
answers, math-verify on the final ``\\boxed{}``. Registered as ``code-interpreter`` on import."""

from dsv32.envs.base import EnvSpec, register
from dsv32.envs.interpreter.env import InterpreterEnv
from dsv32.envs.interpreter.kernel import CellResult, SandboxedKernel
from dsv32.envs.interpreter.tasks import TASK_SETS, generate

register(EnvSpec(InterpreterEnv.name, InterpreterEnv.description, InterpreterEnv, dict(TASK_SETS)))

__all__ = ["CellResult", "InterpreterEnv", "SandboxedKernel", "generate"]
