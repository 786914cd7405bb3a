"""Math problems that need computation, generated with exact answers: a seed and a difficulty.

Four categories, each harder with ``difficulty`` (1–5):

- ``multiplication``: two (from difficulty 4, three) integers of ``5 + 3d`` digits;
- ``modular``: ``a^e mod m`` with ``e`` up to ``10^(4+2d)``, a modular inverse modulo a prime near
  ``10^(6+2d)``, or ``(1^p + … + N^p) mod m`` with ``N = 3000 d``;
- ``combinatorics``: a binomial ``C(n, k)`` with ``n = 30 + 25d``, derangements of ``8 + 4d`` items,
  integer partitions of ``40 + 60d``, or subsets of ``{1..10+6d}`` whose sum is divisible by ``m``;
- ``linear_system``: ``d + 1`` integer unknowns in ``[-20, 20]``, integer coefficients in ``[-9, 9]``,
  a nonsingular matrix; the question asks for one unknown;
- ``chain`` (not in the default mix): a product of two ``3 + 2d``-digit integers, named ``a``, then
  one question about ``a`` (its remainder modulo a prime, digit sum, digits reversed, a power modulo
  ``m``, integer square root, or how often a digit occurs). The reference takes two cells of the
  stateful notebook: the first computes and prints ``a``, the second uses it
  (``info["solution_cells"]``).

Each task's ``answer`` is an integer (as text) computed here, independently of its reference
solution (``info["solution_code"]``, the Python the reference plays through the ``python`` tool).
Generation is deterministic: task ``i`` of a set uses ``random.Random(f"{seed}:{i}")``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from dsv32.envs.base import Task, task_plan

CATEGORIES = ("multiplication", "modular", "combinatorics", "linear_system")
Problem = tuple[str, int, str | list[str]]  # prompt, answer, solution code (or cells, in order)


def _digits(rng: random.Random, n: int) -> int:
    return rng.randrange(10 ** (n - 1), 10**n)


def _prime_near(rng: random.Random, digits: int) -> int:
    import sympy

    return int(sympy.nextprime(_digits(rng, digits)))


def multiplication(rng: random.Random, d: int) -> Problem:
    factors = [_digits(rng, 5 + 3 * d) for _ in range(3 if d >= 4 else 2)]
    shown = " × ".join(str(f) for f in factors)
    return (
        f"Compute the exact value of {shown}.",
        math.prod(factors),
        f"print({' * '.join(map(str, factors))})",
    )


def modular(rng: random.Random, d: int) -> Problem:
    kind = rng.choice(("power", "inverse", "power_sum"))
    if kind == "power":
        a, e, m = _digits(rng, 3 + d), _digits(rng, 4 + 2 * d), _digits(rng, 4 + d)
        return (
            f"What is the remainder when {a}^{e} is divided by {m}?",
            pow(a, e, m),
            f"print(pow({a}, {e}, {m}))",
        )
    if kind == "inverse":
        p = _prime_near(rng, 6 + 2 * d)
        a = rng.randrange(2, p)
        prompt = f"Find the integer x with 0 <= x < {p} such that {a}·x ≡ 1 (mod {p})."
        return prompt, pow(a, -1, p), f"print(pow({a}, -1, {p}))"
    n, p, m = 3000 * d, rng.randrange(3, 8 + d), _digits(rng, 5)
    prompt = f"What is (1^{p} + 2^{p} + 3^{p} + ... + {n}^{p}) mod {m}?"
    answer = sum(k**p for k in range(1, n + 1)) % m
    return prompt, answer, f"print(sum(pow(k, {p}, {m}) for k in range(1, {n} + 1)) % {m})"


def _subset_sums_divisible(n: int, m: int) -> int:
    """Subsets of {1..n} (the empty one included) with sum ≡ 0 mod m, by DP over residues."""
    counts = [1] + [0] * (m - 1)
    for x in range(1, n + 1):
        counts = [counts[r] + counts[(r - x) % m] for r in range(m)]
    return counts[0]


def combinatorics(rng: random.Random, d: int) -> Problem:
    kind = rng.choice(("binomial", "derangements", "partitions", "subset_sums"))
    if kind == "binomial":
        n = 30 + 25 * d
        k = rng.randrange(n // 4, n // 2)
        prompt = f"In how many ways can {k} items be chosen from {n} distinct items (order does not matter)?"
        return prompt, math.comb(n, k), f"import math\nprint(math.comb({n}, {k}))"
    if kind == "derangements":
        n = 8 + 4 * d
        answer = sum((-1) ** i * math.perm(n, n - i) for i in range(n + 1))
        prompt = f"How many permutations of {n} distinct objects leave no object in its original position?"
        code = (
            f"D = [1, 0]\nfor k in range(2, {n} + 1):\n    D.append((k - 1) * (D[-1] + D[-2]))\nprint(D[{n}])"
        )
        return prompt, answer, code
    if kind == "partitions":
        import sympy

        n = 40 + 60 * d
        prompt = f"In how many ways can {n} be written as a sum of positive integers, ignoring the order of the terms?"
        code = (
            f"p = [1] + [0] * {n}\nfor part in range(1, {n} + 1):\n    for s in range(part, {n} + 1):\n"
            f"        p[s] += p[s - part]\nprint(p[{n}])"
        )
        return prompt, int(sympy.partition(n)), code
    n, m = 10 + 6 * d, rng.randrange(3, 14)
    prompt = (
        f"How many subsets of {{1, 2, ..., {n}}} (including the empty set) have a sum of elements "
        f"divisible by {m}?"
    )
    code = (
        f"count = [1] + [0] * {m - 1}\nfor x in range(1, {n} + 1):\n"
        f"    count = [count[r] + count[(r - x) % {m}] for r in range({m})]\nprint(count[0])"
    )
    return prompt, _subset_sums_divisible(n, m), code


def _linear_form(coefficients: list[int], names: list[str]) -> str:
    """``3x - y + 2z`` (zero terms dropped, unit coefficients implicit)."""
    text = ""
    for a, v in zip(coefficients, names):
        if a == 0:
            continue
        sign = "-" if a < 0 else "+"
        term = f"{abs(a) if abs(a) != 1 else ''}{v}"
        text += (f"-{term}" if sign == "-" else term) if not text else f" {sign} {term}"
    return text


def linear_system(rng: random.Random, d: int) -> Problem:
    import sympy

    n = d + 1
    names = ["x", "y", "z", "u", "v", "w"][:n]
    solution = [rng.randint(-20, 20) for _ in range(n)]
    while True:
        rows = [[rng.randint(-9, 9) for _ in range(n)] for _ in range(n)]
        if sympy.Matrix(rows).det() != 0:
            break
    rhs = [sum(a * x for a, x in zip(row, solution)) for row in rows]
    equations = [f"{_linear_form(row, names)} = {b}" for row, b in zip(rows, rhs)]
    j = rng.randrange(n)
    prompt = (
        "Solve the system of linear equations\n"
        + "\n".join(equations)
        + f"\nWhat is the value of {names[j]}?"
    )
    code = f"import sympy\nA = sympy.Matrix({rows})\nb = sympy.Matrix({rhs})\nprint(A.LUsolve(b)[{j}])"
    return prompt, solution[j], code


#: the questions a ``chain`` task can ask about ``a``
CHAIN_STEPS = ("remainder", "digit_sum", "reverse", "power_mod", "isqrt", "digit_count")


def chain_step(rng: random.Random, step: str, a: int) -> tuple[str, int, str]:
    """A question about ``a``, its answer, and the cell that computes it from the notebook's ``a``."""
    if step == "remainder":
        m = rng.choice((97, 101, 997, 1009, 9973, 10007))
        return f"What is the remainder when a is divided by {m}?", a % m, f"print(a % {m})"
    if step == "digit_sum":
        return "What is the sum of the digits of a?", sum(map(int, str(a))), "print(sum(map(int, str(a))))"
    if step == "reverse":
        question = "What number do the digits of a make in reverse order?"
        return question, int(str(a)[::-1]), "print(int(str(a)[::-1]))"
    if step == "power_mod":
        k, m = rng.randrange(3, 10), rng.choice((1000, 9973, 65537))
        return f"What is a^{k} mod {m}?", pow(a, k, m), f"print(pow(a, {k}, {m}))"
    if step == "isqrt":
        question = "What is the integer part of the square root of a?"
        return question, math.isqrt(a), "import math\nprint(math.isqrt(a))"
    k = rng.randrange(10)
    return (
        f"How many times does the digit {k} occur in a?",
        str(a).count(str(k)),
        f"print(str(a).count('{k}'))",
    )


def chain(rng: random.Random, d: int) -> Problem:
    x, y = _digits(rng, 3 + 2 * d), _digits(rng, 3 + 2 * d)
    question, answer, cell = chain_step(rng, rng.choice(CHAIN_STEPS), x * y)
    return f"Let a = {x} × {y}. {question}", answer, [f"a = {x} * {y}\nprint(a)", cell]


GENERATORS: dict[str, Callable[[random.Random, int], Problem]] = {
    "multiplication": multiplication,
    "modular": modular,
    "combinatorics": combinatorics,
    "linear_system": linear_system,
    "chain": chain,
}


def generate(
    n: int,
    *,
    seed: int = 0,
    difficulty: int | None = None,
    categories: tuple[str, ...] = CATEGORIES,
    prefix: str = "math",
) -> list[Task]:
    """``n`` tasks cycling through ``categories``; ``difficulty`` None cycles 1..5 as well."""
    tasks = []
    for i, category, d, rng in task_plan(n, seed, difficulty, categories, GENERATORS, "math"):
        prompt, answer, code = GENERATORS[category](rng, d)
        info = {"category": category, "difficulty": d, "seed": seed}
        if isinstance(code, list):
            info |= {"solution_code": "\n".join(code), "solution_cells": code}
        else:
            info["solution_code"] = code
        tasks.append(Task(f"{prefix}-{seed}-{i:04d}", prompt, str(answer), "math", info))
    return tasks


TASK_SETS: dict[str, Callable[[], list[Task]]] = {
    "train": lambda: generate(200, seed=0),
    "heldout": lambda: generate(40, seed=1),
    "smoke": lambda: generate(8, seed=2, difficulty=1),
}
