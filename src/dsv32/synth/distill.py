"""Specialist distillation (paper §3, "specialist distillation"): each specialist — a checkpoint or
an endpoint — solves its own domain's tasks as an agent; only outputs its domain's verifier accepts
are kept; the union, deduplicated and mixed by per-domain weights, is the generalist's SFT set.

A domain is an environment of :mod:`dsv32.envs` (its verifier is ``env.reward``, reward 1 = kept):
``--specialist code-interpreter=local:runs/math-specialist/model --specialist
search=openai:deepseek-chat@https://api.deepseek.com/v1``. Per domain:

1. ``samples`` agent episodes per task (:func:`dsv32.synth.coldstart.teacher_outcome`);
2. keep the verified ones; drop duplicates (same task and the same assistant turns, normalized);
3. weight ``w``: the kept rows are repeated ``floor(w)`` times and a seeded ``frac(w)`` share of
   them once more (``w = 0.5`` keeps half, ``w = 2`` doubles the domain) — the data mix.

The report counts, per domain: episodes, kept, rejected (by reason), duplicates and rows written.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsv32.envs.base import Environment, Task
from dsv32.synth.coldstart import Outcome, check_out, check_outcomes, check_run, teacher_outcome, write_rows
from dsv32.synth.records import SynthError, dedup_key


@dataclass
class Specialist:
    """One domain: its environment factory, its tasks, the specialist's backend spec (anything with
    ``make()``, ``label``, ``thinking``, ``sampling``: :class:`dsv32.synth.backends.BackendSpec`) and
    its weight in the mix."""

    domain: str
    make_env: Callable[[], Environment]
    tasks: list[Task]
    spec: Any
    weight: float = 1.0

    def __post_init__(self) -> None:
        _check_weight(self.weight, f"domain {self.domain!r}: ")


@dataclass
class DomainReport:
    episodes: int = 0
    kept: int = 0
    rejected: int = 0
    duplicates: int = 0
    written: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


def parse_pairs(items: Sequence[str], what: str) -> dict[str, str]:
    """``["DOMAIN=VALUE", ...]`` → ``{DOMAIN: VALUE}``; each domain once."""
    out: dict[str, str] = {}
    for item in items:
        domain, eq, value = (part.strip() for part in item.partition("="))
        if not eq or not domain or not value:
            raise SynthError(f"{what} {item!r} must look like DOMAIN=VALUE")
        if domain in out:
            raise SynthError(f"{what}: domain {domain!r} is given twice")
        out[domain] = value
    return out


def trajectory_key(row: dict) -> str:
    """Duplicate identity: the task prompt and the assistant turns (text and tool calls), normalized."""
    user = next(m["content"] for m in row["messages"] if m["role"] == "user")
    turns = [
        (m.get("reasoning_content") or "") + " " + (m.get("content") or "") + " "
        + json.dumps([c["function"] for c in m.get("tool_calls") or []], sort_keys=True)
        for m in row["messages"]
        if m["role"] == "assistant"
    ]  # fmt: skip
    return dedup_key(user + "\n" + "\n".join(turns))


def _check_weight(weight: float, where: str = "") -> None:
    if not (math.isfinite(weight) and weight >= 0):
        raise SynthError(f"{where}a mix weight must be a finite number >= 0, got {weight}")


def mix(rows: list[dict], weight: float, rng: random.Random) -> list[dict]:
    """``floor(weight)`` copies of ``rows`` plus a random ``frac(weight)`` share once more."""
    _check_weight(weight)
    whole, part = math.floor(weight), weight - math.floor(weight)
    extra = rng.sample(rows, round(part * len(rows))) if rows else []
    return rows * whole + extra


def distill(
    specialists: Sequence[Specialist],
    out_path: str | Path,
    *,
    samples: int = 1,
    prompt: str = "reasoning_agent",
    max_steps: int = 8,
    workers: int = 4,
    seed: int = 0,
    overwrite: bool = False,
) -> dict[str, DomainReport]:
    """Generate, verify, dedup and mix (see the module docstring); writes ``out_path`` (JSONL) and
    returns the per-domain report. ``out_path`` is checked, replaced and left alone as by
    :func:`dsv32.synth.coldstart.build_coldstart`: checked before any episode, an existing file
    replaced only with ``overwrite``, written at once, and not written when the mix has no row."""
    if not specialists:
        raise SynthError("no specialists: give at least one --specialist DOMAIN=BACKEND")
    check_run(prompt, samples, workers)
    out_path = check_out(out_path, overwrite)
    jobs = [
        (s.domain, lambda s=s, t=t: teacher_outcome(s.make_env, t, prompt, s.spec, max_steps))
        for s in specialists
        for t in s.tasks
        for _ in range(samples)
    ]
    with ThreadPoolExecutor(workers) as pool:
        outcomes: list[tuple[str, Outcome]] = list(pool.map(lambda j: (j[0], j[1]()), jobs))
    reports = {s.domain: DomainReport() for s in specialists}
    kept: dict[str, list[dict]] = {s.domain: [] for s in specialists}
    seen: set[str] = set()
    for domain, o in outcomes:
        r = reports[domain]
        r.episodes += 1
        if o.row is None:
            r.rejected += 1
            r.reasons[o.reason] = r.reasons.get(o.reason, 0) + 1
            continue
        r.kept += 1
        key = trajectory_key(o.row)
        if key in seen:
            r.duplicates += 1
            continue
        seen.add(key)
        o.row["domain"] = domain
        kept[domain].append(o.row)
    rng = random.Random(seed)
    rows: list[dict] = []
    for s in specialists:
        mixed = mix(kept[s.domain], s.weight, rng)
        reports[s.domain].written = len(mixed)
        rows += mixed
    check_outcomes([o for _, o in outcomes], len(rows), out_path)
    write_rows(out_path, rows)
    return reports
