"""An environment's database, drawn from a domain: table and column names picked among the domain's
synonyms, then rows.

Three tables, by role: ``group`` (id, name, place), ``item`` (id, name, group, category, measure) and
``event`` (id, item, amount, status, date). A table's name is one noun synonym, singular or plural,
sometimes prefixed by the domain; its columns are synonyms too, in a drawn order. Ids start at a drawn
offset; names never hold digits (an answer's numbers are read as its claim, see the verifier).
"""

from __future__ import annotations

import datetime
import random
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsv32.synth.programmatic.vocab import (
    ADJECTIVES,
    DATE_COLUMNS,
    FIRST_NAMES,
    ID_COLUMNS,
    LAST_NAMES,
    PERSON,
    STATUS_COLUMNS,
    Domain,
    Entity,
    Noun,
)
from dsv32.synth.records import SynthError

ROLES = ("group", "item", "event")
SQL_TYPES = {int: "INTEGER", str: "TEXT"}


@dataclass
class Table:
    """One table: its role, name, noun, ``columns`` (role of a column -> its name, in table order)
    and rows (role of a column -> value)."""

    role: str
    name: str
    noun: Noun
    columns: dict[str, str]
    rows: list[dict[str, Any]] = field(default_factory=list)

    def by_id(self, key: int) -> dict[str, Any]:
        return next(r for r in self.rows if r["id"] == key)


@dataclass
class World:
    """An environment's data: its domain and its three tables."""

    domain: Domain
    tables: dict[str, Table]

    @property
    def group(self) -> Table:
        return self.tables["group"]

    @property
    def item(self) -> Table:
        return self.tables["item"]

    @property
    def event(self) -> Table:
        return self.tables["event"]

    @property
    def statuses(self) -> tuple[str, str, str]:
        return self.domain.statuses

    def events_of(self, item_id: int, *, status: str | None = None, live: bool = False) -> list[dict]:
        """The item's events, optionally of one status, or ``live``: every one not cancelled."""
        rows = [r for r in self.event.rows if r["item"] == item_id]
        if status is not None:
            rows = [r for r in rows if r["status"] == status]
        return [r for r in rows if r["status"] != self.statuses[2]] if live else rows

    def items_of(self, group_id: int) -> list[dict]:
        return [r for r in self.item.rows if r["group"] == group_id]

    def schema(self) -> dict:
        """What the tool engine needs: each table's name, noun and column names, and the statuses."""
        out: dict[str, Any] = {
            t.role: {"table": t.name, "noun": t.noun.singular, **t.columns, "columns": list(t.columns)}
            for t in self.tables.values()
        }
        out["statuses"] = list(self.statuses)
        return out

    def write(self, path: Path) -> None:
        """The database file: one table per role, keyed by its id column."""
        path.unlink(missing_ok=True)
        db = sqlite3.connect(path)
        try:
            for t in self.tables.values():
                types = {role: SQL_TYPES[type(t.rows[0][role])] for role in t.columns}
                cols = ", ".join(
                    f'"{name}" {types[role]}' + (" PRIMARY KEY" if role == "id" else "")
                    for role, name in t.columns.items()
                )
                db.execute(f'CREATE TABLE "{t.name}" ({cols})')
                marks = ", ".join("?" * len(t.columns))
                db.executemany(
                    f'INSERT INTO "{t.name}" VALUES ({marks})',
                    [tuple(r[c] for c in t.columns) for r in t.rows],
                )
            db.commit()
        finally:
            db.close()


def _table_name(rng: random.Random, domain: Domain, noun: Noun) -> str:
    style = rng.random()
    if style < 0.45:
        return noun.plural
    if style < 0.8:
        return noun.singular
    return f"{domain.slug}_{noun.plural}"


def _id_column(rng: random.Random, noun: Noun) -> str:
    return rng.choice(ID_COLUMNS).format(n=noun.singular)


def _names(rng: random.Random, entity: Entity, k: int) -> list[str]:
    if entity.heads == PERSON:
        pool = [f"{a} {b}" for a in FIRST_NAMES for b in LAST_NAMES]
    else:
        pool = [f"{a} {h.replace('_', ' ')}" for a in ADJECTIVES for h in entity.heads]
    return rng.sample(pool, k)


def _columns(rng: random.Random, roles: dict[str, str]) -> dict[str, str]:
    """``roles`` in a drawn order, the id first."""
    rest = [r for r in roles if r != "id"]
    rng.shuffle(rest)
    return {r: roles[r] for r in ["id", *rest]}


def _draw_columns(rng: random.Random, d: Domain, nouns: dict[str, Noun]) -> dict[str, dict[str, str]]:
    group_id = _id_column(rng, nouns["group"])
    item_id = _id_column(rng, nouns["item"])
    group_ref = group_id if group_id != "id" else f"{nouns['group'].singular}_id"
    item_ref = item_id if item_id != "id" else f"{nouns['item'].singular}_id"
    return {
        "group": {
            "id": group_id,
            "name": rng.choice(d.group.name_columns),
            "place": rng.choice(d.place.columns),
        },
        "item": {
            "id": item_id,
            "name": rng.choice(d.item.name_columns),
            "group": group_ref,
            "category": rng.choice(d.category.columns),
            "measure": rng.choice(d.measure.columns),
        },
        "event": {
            "id": _id_column(rng, nouns["event"]),
            "item": item_ref,
            "amount": rng.choice(d.amount.columns),
            "status": rng.choice(STATUS_COLUMNS),
            "date": rng.choice(DATE_COLUMNS),
        },
    }


def draw_world(rng: random.Random, domain: Domain) -> World:
    """Names and rows of one environment of ``domain``."""
    entities = {"group": domain.group, "item": domain.item, "event": domain.event}
    nouns = {role: rng.choice(e.nouns) for role, e in entities.items()}
    for _ in range(20):  # a drawn column name may repeat another of its table: draw again
        drawn = _draw_columns(rng, domain, nouns)
        if all(len(set(c.values())) == len(c) for c in drawn.values()):
            break
    else:
        raise SynthError(f"domain {domain.name!r}: no distinct column names after 20 draws")
    tables = {
        role: Table(role, _table_name(rng, domain, nouns[role]), nouns[role], _columns(rng, drawn[role]))
        for role in ROLES
    }
    n_groups, n_items = rng.randint(3, 5), rng.randint(7, 12)
    group_ids = _ids(rng, n_groups)
    places = [v.replace("_", " ") for v in domain.place.values]
    tables["group"].rows = [
        {"id": k, "name": name, "place": rng.choice(places)}
        for k, name in zip(group_ids, _names(rng, domain.group, n_groups), strict=True)
    ]
    owners = [group_ids[j % n_groups] for j in range(n_items)]  # every group holds at least two items
    rng.shuffle(owners)
    m = domain.measure
    tables["item"].rows = [
        {
            "id": k,
            "name": name,
            "group": owner,
            "category": rng.choice(domain.category.values),
            "measure": rng.randint(m.low, m.high),
        }
        for k, name, owner in zip(_ids(rng, n_items), _names(rng, domain.item, n_items), owners, strict=True)
    ]
    events, a = [], domain.amount
    start = datetime.date(2025, 1, 1)
    for item in tables["item"].rows:
        for _ in range(rng.randint(1, 4)):
            status = rng.choices(domain.statuses, weights=(5, 3, 2))[0]
            day = (start + datetime.timedelta(days=rng.randrange(365))).isoformat()
            events.append(
                {"item": item["id"], "amount": rng.randint(a.low, a.high), "status": status, "date": day}
            )
    rng.shuffle(events)
    tables["event"].rows = [{"id": k, **e} for k, e in zip(_ids(rng, len(events)), events, strict=True)]
    return World(domain, tables)


def _ids(rng: random.Random, k: int) -> list[int]:
    """``k`` consecutive ids from a drawn start."""
    first = rng.choice((1, 1, 10, 100, rng.randint(2, 900)))
    return list(range(first, first + k))
