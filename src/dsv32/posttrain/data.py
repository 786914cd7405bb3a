"""The data steps of post-training: cold-start conversations from verified trajectories
(``dsv32 posttrain cold-start``) and specialist distillation into one SFT set
(``dsv32 posttrain distill``), over environments named as ``dsv32 envs list`` names them."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from dsv32.envs.base import Task, get_env, resolve_tasks
from dsv32.synth.backends import parse_spec
from dsv32.synth.coldstart import ColdStartReport, build_coldstart
from dsv32.synth.distill import Specialist, distill, parse_pairs
from dsv32.synth.records import SynthError


def env_tasks(env: str, tasks: str | None, limit: int | None = None) -> list[Task]:
    """Environment ``env``'s tasks: its task set or JSONL file ``tasks`` (None: its first set), the
    first ``limit`` of them."""
    rows = resolve_tasks(env, tasks)
    return rows[:limit] if limit else rows


def cold_start(
    env: str,
    out: str | Path,
    *,
    tasks: str | None = None,
    limit: int | None = None,
    teacher: str | None = None,
    **options: Any,
) -> ColdStartReport:
    """Verified thinking-with-tools conversations of ``env``'s tasks written to ``out`` (JSONL), from
    the reference solutions or, with ``teacher`` (a backend spec: ``openai:MODEL@URL``,
    ``local:NAME``), the teacher's episodes. ``options``: those of
    :func:`dsv32.synth.coldstart.build_coldstart` (``prompt``, ``samples``, ``max_steps``,
    ``workers``, ``overwrite``)."""
    spec = get_env(env)
    backend = parse_spec(teacher) if teacher else None
    return build_coldstart(spec.factory, env_tasks(env, tasks, limit), out, teacher=backend, **options)


def specialists(
    pairs: list[str], tasks: list[str], weights: list[str], limit: int | None = None
) -> list[Specialist]:
    """The specialists of ``dsv32 posttrain distill`` from its ``--specialist DOMAIN=BACKEND``,
    ``--tasks DOMAIN=SET_OR_JSONL`` and ``--weight DOMAIN=W`` values (a domain is an environment
    name; its tasks default to the environment's first set, its weight to 1)."""
    specs = parse_pairs(pairs, "--specialist")
    task_sets, weight_of = parse_pairs(tasks, "--tasks"), parse_pairs(weights, "--weight")
    unknown = sorted((set(task_sets) | set(weight_of)) - set(specs))
    if unknown:
        raise SynthError(f"--tasks/--weight name domains without a --specialist: {unknown}")
    out = []
    for domain, text in specs.items():
        try:
            weight = float(weight_of.get(domain, "1"))
        except ValueError:
            raise SynthError(f"--weight {domain}={weight_of[domain]!r} is not a number") from None
        make_env = get_env(domain).factory
        rows = env_tasks(domain, task_sets.get(domain), limit)
        out.append(Specialist(domain, make_env, rows, parse_spec(text), weight))
    return out


def distill_set(team: list[Specialist], out: str | Path, **options: Any) -> dict[str, dict]:
    """Every specialist generates on its domain; the verified, deduplicated, weighted union is
    written to ``out`` (JSONL). ``options``: those of :func:`dsv32.synth.distill.distill`. Returns
    each domain's report."""
    return {d: asdict(r) for d, r in distill(team, out, **options).items()}
