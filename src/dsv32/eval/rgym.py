"""Math and logic from reasoning-gym: procedurally generated problems whose datasets verify answers.

Problems: ``PER_FAMILY`` problems of each family in :data:`FAMILIES` (``--subset`` picks families,
any of reasoning-gym's ~100 may be named), generated with seed :data:`SEED` (the same problems on every
run and machine for a given reasoning-gym version). Prompt: the paper's math template (§4.1),
``{question}\\nPlease reason step by step, and put your final answer within \\boxed{}.``

Score (the headline): the family's own ``score_answer`` on the answer reasoning-gym's evaluation would
hand it. There, ``reasoning_gym.utils.extract_answer`` reads the text between the last complete
``<answer>`` … ``</answer>`` pair of the completion (non-greedily: up to the first closing tag after the
opening one, an unclosed last pair ignored), stripped of surrounding whitespace, None without one; the
text is not unwrapped further. Here the box takes the tags' place (:func:`official_answer`): the answer
is what the model wrote in its last complete outermost ``\\boxed{}`` (or ``\\fbox{}``), as
``extract_answer`` reads it between answer tags. So ``\\boxed{\\boxed{7}}`` answers ``\\boxed{7}``, as
``<answer>\\boxed{7}</answer>`` does, and a box cut off after a complete one leaves the complete one as
the answer. Reasoning-gym gives partial credit for answers that merely contain the right one; the
harness records that value, and pass@k counts only a score of 1.

Secondary metric ``lenient`` (``results.json`` ``secondary``, never the headline): the best of the
headline, ``score_answer`` on the boxed content as :func:`dsv32.eval.answers.last_boxed` reads it (a
box boxed again unwrapped) with a whole ``\\text{...}`` unwrapped, and, for the arithmetic families,
math-verify equality with the reference answer (``\\frac{3}{4}`` for ``3/4``). It reads answers more
generously than the task means (an unsimplified fraction equals the simplified one), so it shows how
much of a gap is notation.

Families were chosen whose verifiers compare strings or numbers in Python (none of them ``eval`` or
sympy-parse the model's text) and whose reference answers score 1.
"""

from __future__ import annotations

import re

from dsv32.chat.templates import MATH_PROMPT
from dsv32.envs.mathcheck import boxes
from dsv32.eval.answers import last_boxed, math_equal
from dsv32.eval.errors import EvalError
from dsv32.eval.types import Benchmark, Problem, Score

MATH = ("chain_sum", "gcd", "lcm", "fraction_simplification", "simple_equations", "complex_arithmetic")
LOGIC = ("knights_knaves", "syllogism", "zebra_puzzles", "family_relationships")
FAMILIES = MATH + LOGIC
PER_FAMILY = 50
SEED = 1234
LENIENT = "lenient"
_TEXT = re.compile(r"^\\text\s*\{(.*)\}$", re.S)
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")  # as dsv32.envs.mathcheck finds boxes


def outermost_box(text: str | None) -> str | None:
    """The raw content of the last complete box that is not inside another box, nothing unwrapped or
    stripped; None when there is none. A box left open holds the rest of the text, so boxes after it
    are inside it: ``\\boxed{5} then \\boxed{6`` reads ``5``, ``\\boxed{6 \\boxed{5}`` reads None."""
    text = text or ""
    answer, end = None, -1
    for start, content in boxes(text):
        if start < end:  # inside the last complete outermost box
            continue
        if content is None:
            break
        answer, end = content, _BOX_OPEN.match(text, start).end() + len(content)
    return answer


def official_answer(text: str | None) -> str | None:
    """What reasoning-gym's evaluation would give ``score_answer`` had the model written its box's
    content between answer tags: ``extract_answer("<answer>" + content + "</answer>")`` of
    :func:`outermost_box` (stripped; answer tags inside the box read as they would between tags)."""
    content = outermost_box(text)
    if content is None:
        return None
    from reasoning_gym.utils import extract_answer

    return extract_answer(f"<answer>{content}</answer>")


def boxed_answer(text: str | None) -> str | None:
    """The last ``\\boxed{}`` content with a whole ``\\text{...}`` unwrapped (the lenient reading)."""
    answer = last_boxed(text)
    if answer is None:
        return None
    match = _TEXT.match(answer)
    return match.group(1).strip() if match else answer


class ReasoningGym(Benchmark):
    name = "reasoning-gym"
    description = (
        f"reasoning-gym math and logic families ({len(FAMILIES)} x {PER_FAMILY}), their own verifiers"
    )
    source = f"reasoning-gym's procedural generators, seed {SEED}"
    packages = ("reasoning-gym",)
    metric = "accuracy"

    def __init__(self, per_family: int = PER_FAMILY, seed: int = SEED) -> None:
        super().__init__()
        self.per_family, self.seed = per_family, seed
        self._datasets: dict[str, object] = {}

    def subsets(self) -> list[str]:
        return list(FAMILIES)

    def _dataset(self, family: str):
        if family not in self._datasets:
            import reasoning_gym
            from reasoning_gym.factory import DATASETS

            if family not in DATASETS:
                raise EvalError(f"reasoning-gym has no task family {family!r}; e.g. {', '.join(FAMILIES)}")
            self._datasets[family] = reasoning_gym.create_dataset(
                family, size=self.per_family, seed=self.seed
            )
        return self._datasets[family]

    def problems(self, subset: list[str] | None = None, data: str | None = None) -> list[Problem]:
        out = []
        for family in subset or FAMILIES:
            for i, entry in enumerate(self._dataset(family)):
                messages = [{"role": "user", "content": MATH_PROMPT.format(question=entry["question"])}]
                out.append(Problem(f"{family}/{i}", messages, [], family, {"family": family, "entry": entry}))
        return out

    def score(self, problem: Problem, message: dict) -> Score:
        content = message.get("content")
        answer = official_answer(content)
        family, entry = problem.data["family"], problem.data["entry"]
        dataset = self._dataset(family)
        value = float(dataset.score_answer(answer, entry))  # None (no box) too: the family decides
        if answer is None:
            return Score(value, "no \\boxed{} answer", {LENIENT: value})
        lenient, unwrapped = value, boxed_answer(content)
        if lenient < 1.0 and unwrapped != answer:
            lenient = max(lenient, float(dataset.score_answer(unwrapped, entry)))
        if lenient < 1.0 and family in MATH and math_equal(str(entry["answer"]), unwrapped):
            lenient = 1.0
        why = f"answered {answer[:80]!r}, expected {str(entry['answer'])[:80]!r}"
        return Score(value, why, {LENIENT: lenient})

    def reference(self, problem: Problem) -> dict:
        return {"role": "assistant", "content": f"\\boxed{{{problem.data['entry']['answer']}}}"}
