"""``code-interpreter``: a persistent, sandboxed Jupyter kernel per episode, one tool ``python(code)``,
and a math-verify check of the final ``\\boxed{}`` answer (paper §3.2.3, "Code Interpreter Agent").

The kernel starts on the episode's first ``python`` call (an episode that never calls it costs no
kernel) and lives until ``reset`` or ``close``; a start waits its turn when many episodes start
kernels at once (:data:`~dsv32.envs.interpreter.kernel.CONCURRENT_STARTS`), and that wait is not
the cell's time: the agent waits for a call as long as the kernel's own limits allow
(:meth:`InterpreterEnv.call_bound_s`), so the model never reads a start under load as its code
timing out. Cells run one at a time: a call that arrives while
an earlier cell still runs (its caller stopped waiting, as the agent does at its tool timeout) waits
for it at most ``busy_wait_s`` seconds, then answers that the kernel is busy without running.

Reward: 1 when the last ``\\boxed{…}`` of the final answer equals the task's answer, else 0;
components ``boxed`` (an answer was boxed) and ``correct``.
"""

from __future__ import annotations

import threading

from dsv32.envs import sandbox
from dsv32.envs.base import EnvError, Environment, Reward, Task, TrajectoryLike, tool_call, tool_schema
from dsv32.envs.interpreter.kernel import SandboxedKernel, execute_bound_s
from dsv32.envs.interpreter.verify import last_boxed, math_equal

SYSTEM_PROMPT = (
    "You can run Python with the `python` tool: the code runs in a stateful Jupyter notebook (variables "
    "persist between calls), and the tool answers with what the cell printed, the value of its last "
    "expression, or its error. A cell that runs longer than {timeout:g} seconds is interrupted. Use it "
    "for any computation you cannot do exactly by hand. When you are done, give the final answer as "
    "\\boxed{{...}}."
)
#: ``system_prompt = "short"``: the same instructions in a quarter of the tokens (a 135M model on a CPU
#: reads the system prompt again at every model call of every episode)
SHORT_SYSTEM_PROMPT = (
    "Use the `python` tool (a stateful notebook) to compute exactly. Give the final answer as \\boxed{{...}}."
)
SYSTEM_PROMPTS = {"full": SYSTEM_PROMPT, "short": SHORT_SYSTEM_PROMPT}


class InterpreterEnv(Environment):
    """One episode: a task, a kernel (started lazily), the calls made so far."""

    name = "code-interpreter"
    description = "math problems that need computation; a sandboxed Jupyter kernel; math-verify on \\boxed{}"

    def __init__(
        self,
        *,
        cell_timeout_s: float = 30,
        memory_mb: int = 2048,
        cpu_s: float = 600,
        max_output_chars: int = 8000,
        isolation: str | None = None,
        busy_wait_s: float = 10,
        disk_mb: int = sandbox.DISK_MB,
        system_prompt: str = "full",
    ) -> None:
        if system_prompt not in SYSTEM_PROMPTS:
            raise EnvError(f"system_prompt must be one of {', '.join(SYSTEM_PROMPTS)}, got {system_prompt!r}")
        self.system_prompt = SYSTEM_PROMPTS[system_prompt]
        self.cell_timeout_s, self.memory_mb, self.cpu_s = cell_timeout_s, memory_mb, cpu_s
        self.disk_mb = disk_mb
        self.max_output_chars, self.isolation, self.busy_wait_s = max_output_chars, isolation, busy_wait_s
        self.task: Task | None = None
        self.kernel: SandboxedKernel | None = None
        self.calls: list[dict] = []
        self._lock = threading.Lock()  # a call that timed out may still be running in another thread

    def reset(self, task: Task) -> list[dict]:
        if task.answer is None:
            raise EnvError(f"task {task.id!r}: the code interpreter needs an 'answer' to check against")
        self.close()
        self.task, self.calls = task, []
        system = self.system_prompt.format(timeout=self.cell_timeout_s)
        return [{"role": "system", "content": system}, {"role": "user", "content": task.prompt}]

    def tools(self) -> list[dict]:
        code = {"type": "string", "description": "Python source of one notebook cell"}
        return [tool_schema("python", "Run a cell in a stateful Python notebook.", {"code": code})]

    def call(self, name: str, arguments: dict) -> str:
        if self.task is None:
            raise EnvError("call() before reset(): start an episode with env.reset(task)")
        if name != "python":
            return f"error: unknown tool {name!r}; the only tool is 'python'"
        code = arguments.get("code") if isinstance(arguments, dict) else None
        if not isinstance(code, str):
            return "error: the python tool takes one argument, 'code' (a string of Python source)"
        with self._lock:
            if self.kernel is None:  # its kernel starts with the first cell, on the kernel's own thread
                options = {"memory_mb": self.memory_mb, "cpu_s": self.cpu_s, "disk_mb": self.disk_mb}
                options["kind"] = self.isolation
                self.kernel = SandboxedKernel(**options, start=False)
            kernel, calls = self.kernel, self.calls  # this episode's, even if a reset comes first
        result = kernel.execute(
            code, timeout_s=self.cell_timeout_s, max_chars=self.max_output_chars, wait_s=self.busy_wait_s
        )
        calls.append({"status": result.status, "seconds": round(result.seconds, 4)})
        return result.text

    def call_bound_s(self, name: str) -> float:
        """A call returns within the kernel's own limits (a busy wait, a start, the cell, a
        restart): the agent waits for that, plus a second, rather than its generic timeout."""
        return execute_bound_s(self.cell_timeout_s, self.busy_wait_s) + 1.0

    def reward(self, trajectory: TrajectoryLike) -> Reward:
        if self.task is None:
            raise EnvError("reward() before reset(): there is no task to check against")
        boxed = last_boxed(trajectory.final)
        if boxed is None:
            return Reward(0.0, {"boxed": 0.0, "correct": 0.0}, "no \\boxed{} answer in the final message")
        ok = math_equal(boxed, str(self.task.answer))
        reason = f"boxed {boxed!r} {'equals' if ok else 'differs from'} the answer {self.task.answer!r}"
        return Reward(float(ok), {"boxed": 1.0, "correct": float(ok)}, reason)

    def reference(self, task: Task) -> list[dict]:
        """Run the task's solution cells (``info["solution_cells"]``, one ``python`` call each, in
        order) or its solution code, when it has any, then box the answer."""
        final = {"role": "assistant", "content": f"The answer is \\boxed{{{task.answer}}}."}
        cells = task.info.get("solution_cells") or [c for c in [task.info.get("solution_code")] if c]
        calls = [tool_call("python", {"code": c}, f"{task.id}-ref-{i}") for i, c in enumerate(cells)]
        return [*({"role": "assistant", "content": "", "tool_calls": [c]} for c in calls), final]

    def state(self) -> dict:
        return {
            "task": self.task.id if self.task else None,
            "calls": list(self.calls),
            "kernel_alive": bool(self.kernel and self.kernel.alive()),
            "kernel_restarts": self.kernel.restarts if self.kernel else 0,
        }

    def close(self) -> None:
        with self._lock:
            kernel, self.kernel = self.kernel, None
        if kernel is not None:
            kernel.close()
