"""What every synthesized item carries: provenance, token usage and its cost, and dedup keys.

- **Provenance** (:func:`provenance`): the generator model(s), the prompts version
  (:data:`dsv32.synth.prompts.PROMPTS_VERSION`), the UTC date, the dsv32 version and the run's
  settings — synthesized tasks are data, and data says where it came from.
- **Cost**: ``cost = (prompt − cached)·p_in + cached·p_cached + completion·p_out`` in USD, with prices
  per million tokens (:class:`Pricing`); a kept task's cost is its episode's cost divided by the tasks
  that episode kept.
- **Dedup**: ``normalize(text)`` lower-cases, replaces punctuation with spaces and collapses
  whitespace; a task's key is ``sha256(normalize(text) ‖ tool-signature hash)``, where the
  tool-signature hash (:func:`tool_signature`) covers the sorted tool names with their sorted
  parameter names and types (empty for tasks without their own tools). Two tasks with the same
  normalized text over the same tool interface are one task; the tool-signature hash alone names
  the environment a task belongs to.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import re
import unicodedata
from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Any

from dsv32.errors import DSV32Error


class SynthError(DSV32Error, ValueError):
    """A synthesis run that cannot start or go on as asked: a bad backend spec, a bad setting, an
    output directory that belongs to another run."""


class JobFailed(SynthError):
    """A job that cannot finish now (an endpoint that kept failing after its retries): logged as an
    error and run again on the next run. ``usage`` is what it spent before it failed, so the run's
    totals count it."""

    def __init__(self, message: str, usage: RoleUsage) -> None:
        super().__init__(message)
        self.usage = usage


@dataclass
class TokenUsage:
    """Tokens spent by one role (constructor, answerer, verifier, policy) over one or more calls."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    calls: int = 0

    def add(self, prompt: int, completion: int, cached: int = 0, calls: int = 1) -> None:
        self.prompt_tokens += int(prompt)
        self.completion_tokens += int(completion)
        self.cached_tokens += int(cached)
        self.calls += calls

    def add_trajectory(self, trajectory: Any) -> None:
        """Every model call of an :class:`dsv32.agent.Trajectory` (its ``steps``)."""
        for step in trajectory.steps:
            self.add(step.prompt_tokens, step.completion_tokens, step.cached_tokens)


@dataclass(frozen=True)
class Pricing:
    """USD per million tokens; ``cached_in`` defaults to ``input`` (no cache discount)."""

    input: float = 0.0
    output: float = 0.0
    cached_in: float | None = None

    def __post_init__(self) -> None:
        for name in ("input", "output", "cached_in"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise SynthError(f"price {name}={value} must be a number >= 0 (USD per million tokens)")

    def cost(self, usage: TokenUsage) -> float:
        cached = min(usage.cached_tokens, usage.prompt_tokens)
        cached_price = self.input if self.cached_in is None else self.cached_in
        fresh = usage.prompt_tokens - cached
        return (fresh * self.input + cached * cached_price + usage.completion_tokens * self.output) / 1e6


@dataclass
class RoleUsage:
    """Usage and price per role of one synthesis job; ``cost`` sums the roles."""

    roles: dict[str, TokenUsage] = field(default_factory=dict)
    prices: dict[str, Pricing] = field(default_factory=dict)

    def role(self, name: str, pricing: Pricing | None = None) -> TokenUsage:
        if pricing is not None:
            self.prices[name] = pricing
        return self.roles.setdefault(name, TokenUsage())

    def cost(self) -> float:
        return sum(self.prices.get(name, Pricing()).cost(u) for name, u in self.roles.items())

    def to_dict(self) -> dict:
        return {
            "roles": {name: asdict(u) for name, u in self.roles.items()},
            "cost_usd": round(self.cost(), 8),
        }


_PUNCT = re.compile(r"[^\w\s]+")


def normalize(text: str) -> str:
    """Lower-case NFKC text with punctuation turned into spaces and whitespace collapsed."""
    text = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(_PUNCT.sub(" ", text).split())


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def tool_signature(schemas: list[dict]) -> str:
    """A hash of a tool interface: sorted tool names, each with its sorted (parameter, type) pairs."""
    entries = []
    for schema in schemas:
        function = schema.get("function", schema)
        props = (function.get("parameters") or {}).get("properties") or {}
        params = sorted((name, str((spec or {}).get("type", ""))) for name, spec in props.items())
        entries.append([function.get("name", ""), params])
    return _sha(json.dumps(sorted(entries), separators=(",", ":")))[:16] if entries else ""


def dedup_key(text: str, signature: str = "") -> str:
    """The identity of a task: its normalized text over its tool interface (see the module docstring)."""
    return _sha(normalize(text) + "\x00" + signature)[:24]


def provenance(generators: dict[str, str], settings: dict | None = None) -> dict:
    """Where synthesized data came from: ``generators`` maps a role to its model, ``settings`` are
    the run's options (kept as given, JSON-serializable)."""
    from dsv32.synth.prompts import PROMPTS_VERSION

    try:
        version = metadata.version("dsv32")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return {
        "generators": dict(generators),
        "prompts_version": PROMPTS_VERSION,
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "dsv32_version": version,
        "settings": json.loads(json.dumps(settings or {}, default=str)),
    }
