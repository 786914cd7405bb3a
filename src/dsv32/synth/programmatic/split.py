"""The domain-level split: whole domains are held out, and nothing of a held-out domain — its name, a
table name or a tool name — may appear in a training environment.

:func:`split_domains` picks the held-out domains; :func:`split_environments` assigns environments by
domain and enforces the rule with :func:`check_disjoint`, raising :class:`SplitError` on any overlap.
An environment is compared through its :class:`Card` (domain, tables, tools), which
:func:`card_of_bundle` reads off any ``general-tools`` bundle — a programmatic one or one the LLM loop
wrote (its domain is ``task.json``'s ``category``).
"""

from __future__ import annotations

import json
import random
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dsv32.synth.records import SynthError


class SplitError(SynthError):
    """A split that would let a held-out domain, table or tool name into training, or that names
    domains it cannot split (unknown, none held out, none left to train on)."""


@dataclass(frozen=True)
class DomainSplit:
    train: tuple[str, ...]
    heldout: tuple[str, ...]

    def of(self, domain: str) -> str:
        if domain in self.heldout:
            return "heldout"
        if domain in self.train:
            return "train"
        raise SplitError(f"domain {domain!r} is in neither side of the split")


@dataclass(frozen=True)
class Card:
    """What the split compares of an environment."""

    id: str
    domain: str
    tables: frozenset[str]
    tools: frozenset[str]


def split_domains(
    domains: Sequence[str], *, heldout: Sequence[str] | None = None, fraction: float = 0.2, seed: int = 0
) -> DomainSplit:
    """Hold out ``heldout`` (names), or else ``round(fraction · len(domains))`` domains (at least one)
    drawn with ``seed``; the rest train. Both sides come back sorted."""
    domains = sorted(set(domains))
    if heldout is not None:
        unknown = sorted(set(heldout) - set(domains))
        if unknown:
            raise SplitError(f"held-out domains {unknown} are not among {', '.join(domains)}")
        held = sorted(set(heldout))
    else:
        if not 0 < fraction < 1:
            raise SplitError(f"the held-out fraction must be in (0, 1), got {fraction}")
        k = max(1, round(fraction * len(domains)))
        held = sorted(random.Random(f"synth-envs-split:{seed}").sample(domains, min(k, len(domains))))
    train = [d for d in domains if d not in held]
    if not held or not train:
        raise SplitError(f"a split needs domains on both sides; held out {held} of {len(domains)}")
    return DomainSplit(tuple(train), tuple(held))


def _tokens(name: str) -> list[str]:
    return name.lower().replace(" ", "_").split("_")


def _mentions(name: str, domain: str) -> bool:
    """Whether identifier ``name`` holds the domain's words as consecutive ``_``-separated tokens."""
    have, want = _tokens(name), _tokens(domain)
    return any(have[k : k + len(want)] == want for k in range(len(have) - len(want) + 1))


def check_disjoint(train: Iterable[Card], heldout: Iterable[Card]) -> None:
    """Raise :class:`SplitError` if a training environment has a held-out domain, a table or tool name
    of a held-out environment, or a table or tool name made of a held-out domain's name."""
    heldout = list(heldout)
    domains = {c.domain for c in heldout}
    tables = set().union(*(c.tables for c in heldout)) if heldout else set()
    tools = set().union(*(c.tools for c in heldout)) if heldout else set()
    problems = []
    for c in train:
        if c.domain in domains:
            problems.append(f"{c.id} is of held-out domain {c.domain!r}")
        problems += [f"{c.id} has held-out table {t!r}" for t in sorted(c.tables & tables)]
        problems += [f"{c.id} has held-out tool {t!r}" for t in sorted(c.tools & tools)]
        problems += [
            f"{c.id} names {n!r} after held-out domain {d!r}"
            for n in sorted(c.tables | c.tools)
            for d in sorted(domains)
            if _mentions(n, d)
        ]
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise SplitError(f"the split leaks held-out names into training: {'; '.join(problems[:5])}{more}")


def split_environments(cards: Iterable[Card], split: DomainSplit) -> tuple[list[Card], list[Card]]:
    """``(train, heldout)`` by domain, checked with :func:`check_disjoint`."""
    train, heldout = [], []
    for c in cards:
        (heldout if split.of(c.domain) == "heldout" else train).append(c)
    check_disjoint(train, heldout)
    return train, heldout


def card_of_bundle(path: str | Path) -> Card:
    """The card of a ``general-tools`` bundle directory: ``task.json``'s category as the domain, the
    database's tables, ``tools.json``'s tool names."""
    path = Path(path)
    task = json.loads((path / "task.json").read_text(encoding="utf-8"))
    tools = json.loads((path / "tools.json").read_text(encoding="utf-8"))
    db = sqlite3.connect(f"file:{path / 'db.sqlite'}?mode=ro", uri=True)
    try:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        db.close()
    env = (task.get("provenance") or {}).get("environment") or task.get("id") or path.name
    names = frozenset(t["function"]["name"] for t in tools)
    return Card(str(env), str(task.get("category", "")), frozenset(tables), names)
