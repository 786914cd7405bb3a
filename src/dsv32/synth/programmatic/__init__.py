"""Programmatic environment synthesis (no model): general-agent environments drawn from a domain
vocabulary by seed — a SQLite database, 3-8 tools, tasks of 2-4 tool calls with a verifier and a
reference solution — written in the bundle format of the LLM synthesis loop and checked as it checks
its versions. See docs/synth.md.

- :mod:`.vocab`, :mod:`.domains` — the domains and their synonyms;
- :mod:`.schema` — an environment's tables and rows; :mod:`.toolset` — its tools and ``tools.py``;
- :mod:`.tasks` — task templates (prompt, solution, verifier parameters);
- :mod:`.environment` — drawing environments with distinct toolsets;
- :mod:`.bundles` — writing and checking bundles; :mod:`.generate` — the command's work, the cache;
- :mod:`.split` — the domain-level train/held-out split.
"""

from dsv32.synth.programmatic.environment import Environment, draw_environment, draw_environments
from dsv32.synth.programmatic.generate import cached_set, card_of, generate, sandbox_check, tasks_of
from dsv32.synth.programmatic.split import (
    Card,
    DomainSplit,
    SplitError,
    card_of_bundle,
    check_disjoint,
    split_domains,
    split_environments,
)

__all__ = [
    "Card",
    "DomainSplit",
    "Environment",
    "SplitError",
    "cached_set",
    "card_of",
    "card_of_bundle",
    "check_disjoint",
    "draw_environment",
    "draw_environments",
    "generate",
    "sandbox_check",
    "split_domains",
    "split_environments",
    "tasks_of",
]
