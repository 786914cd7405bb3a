"""The words an environment is drawn from: what a domain is made of, and the pools every domain shares.

A domain has three entities — a *group* (a ward, a branch, a port), the *items* that belong to a group
(physicians, books, vessels) and the *events* of an item (appointments, loans, voyages) — and, for
each, synonyms of its noun, synonyms of its columns and pools of values. Two environments of one domain
draw different synonyms, so their tables, columns and tools are named differently; the nouns of one
domain are never the nouns of another (checked by :func:`check_vocabulary`), which is what lets a
domain-level split keep every table and tool name of a held-out domain out of the training set.
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass

from dsv32.synth.records import SynthError

_IDENTIFIER = re.compile(r"^[a-z][a-z_]*[a-z]$")
# Words SQLite or Python give a meaning of their own: never a table, column or argument name.
RESERVED = frozenset(keyword.kwlist) | {
    "order", "group", "select", "table", "index", "key", "check", "default", "references", "where",
    "values", "limit", "offset", "by", "on", "set", "case", "when", "then", "end", "join", "union", "all",
    "distinct", "primary", "db", "json",
}  # fmt: skip


@dataclass(frozen=True)
class Noun:
    singular: str
    plural: str

    def forms(self) -> tuple[str, str]:
        return self.singular, self.plural


def noun(singular: str, plural: str | None = None) -> Noun:
    """A noun with its plural (regular English rules unless ``plural`` is given)."""
    if plural is None:
        if singular.endswith("y") and singular[-2:-1] not in set("aeiou"):
            plural = singular[:-1] + "ies"
        elif singular.endswith(("s", "x", "ch", "sh")):
            plural = singular + "es"
        else:
            plural = singular + "s"
    return Noun(singular, plural)


def nouns(*words: str) -> tuple[Noun, ...]:
    """Nouns from words; ``"man:men"`` gives an irregular plural."""
    return tuple(noun(*w.split(":")) for w in words)


@dataclass(frozen=True)
class Entity:
    """One table's vocabulary: noun synonyms, synonyms of its name column, and its names (``heads``
    combined with :data:`ADJECTIVES`, or :data:`PERSON` for people)."""

    nouns: tuple[Noun, ...]
    heads: tuple[str, ...]
    name_columns: tuple[str, ...] = ("name", "title", "label")


@dataclass(frozen=True)
class Attribute:
    """A column with synonyms and either a pool of text values or an integer range ``[low, high]``."""

    columns: tuple[str, ...]
    values: tuple[str, ...] = ()
    low: int = 0
    high: int = 0


@dataclass(frozen=True)
class Domain:
    """A domain: its entities, the group's place, the item's category and measure, the event's amount
    and the event statuses ``(open, done, cancelled)``."""

    name: str
    group: Entity
    item: Entity
    event: Entity
    place: Attribute
    category: Attribute
    measure: Attribute
    amount: Attribute
    statuses: tuple[str, str, str]

    @property
    def slug(self) -> str:
        return self.name.replace(" ", "_")

    def table_nouns(self) -> set[str]:
        """Every word this domain may use as a table noun (singular and plural)."""
        return {w for e in (self.group, self.item, self.event) for n in e.nouns for w in n.forms()}


PERSON = ("<person>",)  # an Entity's heads: people's names, FIRST_NAMES x LAST_NAMES
FIRST_NAMES = (
    "Ada", "Bruno", "Carmen", "Dmitri", "Elena", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Keiko",
    "Lucia", "Marek", "Nadia", "Omar", "Priya", "Quentin", "Rosa", "Stefan", "Tamsin", "Umar", "Vera",
    "Wendell", "Ximena", "Yusuf", "Zora", "Anders", "Beatriz", "Cyril", "Dalia",
)  # fmt: skip
LAST_NAMES = (
    "Abbott", "Baptiste", "Castillo", "Delacroix", "Eriksen", "Fontaine", "Galloway", "Haddad",
    "Ivanova", "Jansen", "Kowalski", "Lindqvist", "Moreau", "Nakamura", "Okafor", "Petrov", "Quinlan",
    "Rasmussen", "Santoro", "Takahashi", "Underwood", "Valdez", "Whitfield", "Yilmaz", "Zimmer",
)  # fmt: skip
ADJECTIVES = (
    "Amber", "Azure", "Bright", "Cedar", "Coral", "Crimson", "Dusky", "Emerald", "Golden", "Hazel",
    "Indigo", "Ivory", "Jade", "Lunar", "Maple", "Misty", "Northern", "Olive", "Quiet", "Royal",
    "Russet", "Scarlet", "Silver", "Solar", "Stone", "Swift", "Velvet", "Willow", "Winter", "Zephyr",
)  # fmt: skip
ID_COLUMNS = ("id", "{n}_id", "{n}_no", "{n}_ref")
DATE_COLUMNS = ("date", "day", "held_on", "scheduled_on", "on_date")
STATUS_COLUMNS = ("status", "state", "stage")


def label(column: str) -> str:
    """How a prompt names a column: ``ticket_price`` -> ``ticket price``."""
    return column.replace("_", " ")


def check_vocabulary(domains: tuple[Domain, ...]) -> None:
    """Raise :class:`SynthError` when the vocabulary breaks its rules: at least 20 domains with
    distinct names; identifiers that SQL and Python read as plain names; enough names and values to
    draw from (a name's head never one of its adjectives); and no table noun shared by two domains."""
    if len(domains) < 20 or len({d.name for d in domains}) != len(domains):
        raise SynthError(f"the vocabulary needs at least 20 distinct domains, has {len(domains)}")
    owner: dict[str, str] = {}
    for d in domains:
        words = [
            *d.table_nouns(),
            *(c for e in (d.group, d.item, d.event) for c in e.name_columns),
            *(c for a in (d.place, d.category, d.measure, d.amount) for c in a.columns),
        ]
        bad = [w for w in words if not _IDENTIFIER.match(w) or w in RESERVED]
        if bad:
            raise SynthError(f"domain {d.name!r}: {bad} cannot be table, column or argument names")
        for e in (d.group, d.item, d.event):
            if e.heads != PERSON and (len(e.heads) < 4 or set(e.heads) & set(ADJECTIVES)):
                raise SynthError(
                    f"domain {d.name!r}: an entity needs at least 4 name heads, none an adjective"
                )
        if len(d.place.values) < 4 or len(d.category.values) < 4:
            raise SynthError(f"domain {d.name!r}: places and categories need at least 4 values each")
        if not 0 < d.measure.low < d.measure.high or not 0 < d.amount.low < d.amount.high:
            raise SynthError(f"domain {d.name!r}: measure and amount need ranges 0 < low < high")
        for word in d.table_nouns():
            if owner.setdefault(word, d.name) != d.name:
                raise SynthError(f"table noun {word!r} belongs to both {owner[word]!r} and {d.name!r}")
