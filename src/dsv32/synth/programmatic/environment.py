"""Drawing environments: a domain, its data, 3-8 tools and the tasks over them, from ``(seed, index)``.

Environment ``i`` of a seed takes the ``i``-th domain of a seeded order of :data:`DOMAINS` (so every
domain gets its share) and draws from ``random.Random(f"synth-envs:{seed}:{i}:{attempt}")``; an
attempt whose toolset signature an earlier environment already has, or whose data does not admit its
tasks, is drawn again with the next attempt. Drawing is pure (nothing is written) and sequential: the
first ``k`` environments of ``n`` are the same for every ``n >= k``.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass

from dsv32.synth.programmatic.domains import DOMAINS
from dsv32.synth.programmatic.schema import World, draw_world
from dsv32.synth.programmatic.tasks import GUESSES, SMALL, TEMPLATES, TaskDraw
from dsv32.synth.programmatic.toolset import KINDS, Tool, draw_tools, signature
from dsv32.synth.records import SynthError

MIN_TOOLS, MAX_TOOLS = 3, 8
ATTEMPTS = 200


@dataclass
class Environment:
    id: str
    index: int
    world: World
    tools: list[Tool]
    tasks: list[TaskDraw]

    @property
    def domain(self) -> str:
        return self.world.domain.name

    @property
    def signature(self) -> frozenset[tuple[str, tuple[str, ...]]]:
        return signature(self.tools)

    @property
    def signature_hash(self) -> str:
        return hashlib.sha256(json.dumps(sorted(self.signature)).encode()).hexdigest()[:16]


def domain_order(seed: int) -> list[str]:
    names = [d.name for d in DOMAINS]
    random.Random(f"synth-envs:{seed}:domains").shuffle(names)
    return names


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[\W_]+", " ", text.casefold()).split())


def _guessable(task: TaskDraw, world: World) -> bool:
    """Whether an idle policy could pass the answer check: an expected answer among the guesses
    (when the database need not change), or a name another candidate contains."""
    if task.change is None:
        if _norm(task.expected) in {_norm(c) for c in GUESSES}:
            return True
        if task.answer["kind"] == "number" and abs(task.answer["value"]) <= SMALL:
            return True
    if task.answer["kind"] == "choice":
        table = next(t for t in world.tables.values() if t.name == task.answer["table"])
        role = next(r for r, c in table.columns.items() if c == task.answer["column"])
        want = f" {_norm(task.expected)} "
        others = {_norm(str(r[role])) for r in table.rows} - {_norm(task.expected)}
        return any(want in f" {o} " or f" {o} " in want for o in others)
    return False


def _attempt(
    rng: random.Random, world: World, tasks_per_env: int
) -> tuple[list[Tool], list[TaskDraw]] | None:
    names = list(TEMPLATES)
    rng.shuffle(names)
    chosen, kinds = [], []
    for name in names:
        union = kinds + [k for k in TEMPLATES[name][0] if k not in kinds]
        if len(union) <= MAX_TOOLS and len(chosen) < tasks_per_env:
            chosen, kinds = [*chosen, name], union
    if len(chosen) < tasks_per_env:
        return None
    size = rng.randint(max(MIN_TOOLS, len(kinds)), MAX_TOOLS)
    extra = [k for k in KINDS if k not in kinds]
    kinds += rng.sample(extra, size - len(kinds))
    rng.shuffle(kinds)
    tools = draw_tools(rng, world, kinds)
    by_kind = {t.kind: t for t in tools}
    tasks = []
    for name in chosen:
        task = TEMPLATES[name][1](rng, world, by_kind)
        if task is None or _guessable(task, world):
            return None
        tasks.append(task)
    return tools, tasks


def draw_environment(seed: int, index: int, taken: set, tasks_per_env: int = 2) -> Environment:
    """Environment ``index`` of ``seed`` whose toolset signature is not in ``taken`` (which it joins)."""
    domain = next(d for d in DOMAINS if d.name == domain_order(seed)[index % len(DOMAINS)])
    for attempt in range(ATTEMPTS):
        rng = random.Random(f"synth-envs:{seed}:{index}:{attempt}")
        world = draw_world(rng, domain)
        drawn = _attempt(rng, world, tasks_per_env)
        if drawn is None or signature(drawn[0]) in taken:
            continue
        env = Environment(f"{domain.slug.replace('_', '-')}-{seed}-{index:05d}", index, world, *drawn)
        taken.add(env.signature)
        return env
    raise SynthError(
        f"environment {index} of seed {seed} ({domain.name}): no new toolset with {tasks_per_env} feasible "
        f"tasks in {ATTEMPTS} draws; ask for fewer tasks per environment"
    )


def draw_environments(n: int, seed: int, tasks_per_env: int = 2) -> list[Environment]:
    """The first ``n`` environments of ``seed``: distinct toolset signatures, deterministic."""
    if n < 1:
        raise SynthError(f"n must be at least 1, got {n}")
    if not 1 <= tasks_per_env <= 4:
        raise SynthError(f"tasks per environment must be 1..4, got {tasks_per_env}")
    taken: set = set()
    return [draw_environment(seed, i, taken, tasks_per_env) for i in range(n)]
