"""An environment's tools: lookups, filters, joins, aggregates and updates over its three tables, each
with a name, argument names, a description and a result shape drawn for the environment, and the
``tools.py`` that implements them (the engine of ``sources/tools_engine.py`` plus one function per
tool whose signature and docstring are the tool's schema, as the synthesis harness reads it).

A toolset's signature is the set of ``(tool name, sorted argument names)``: :func:`signature`.
"""

from __future__ import annotations

import json
import keyword
import random
from dataclasses import dataclass
from pathlib import Path

from dsv32.synth.programmatic.schema import World
from dsv32.synth.programmatic.vocab import label
from dsv32.synth.records import SynthError

ENGINE = Path(__file__).with_name("sources") / "tools_engine.py"
PY_TYPES = {"int": "int", "str": "str"}


@dataclass(frozen=True)
class Kind:
    """A kind of tool: its argument roles with types, optional roles, what it returns (``list``,
    ``one`` row or ``agg``: named numbers), name templates and first lines of its description."""

    roles: tuple[tuple[str, str], ...]
    returns: str
    names: tuple[str, ...]
    phrases: tuple[str, ...]
    optional: tuple[str, ...] = ()
    writes: bool = False


KINDS: dict[str, Kind] = {
    "find_item": Kind((("text", "str"),), "list",
                      ("find_{i}", "search_{ip}", "lookup_{i}", "find_{ip}_by_name", "search_{i}_names", "locate_{i}"),
                      ("Search the {ip} by name.", "Find {ip} whose name contains the given text.")),
    "find_group": Kind((("text", "str"),), "list",
                       ("find_{g}", "search_{gp}", "lookup_{g}", "find_{gp}_by_name", "search_{g}_names", "locate_{g}"),
                       ("Search the {gp} by name.", "Find {gp} whose name contains the given text.")),
    "get_item": Kind((("item", "int"),), "one",
                     ("get_{i}", "get_{i}_details", "fetch_{i}", "{i}_record", "describe_{i}", "read_{i}"),
                     ("One {i} with every field, by id.", "The full record of {a_i}.")),
    "get_group": Kind((("group", "int"),), "one",
                      ("get_{g}", "get_{g}_details", "fetch_{g}", "{g}_record", "describe_{g}", "read_{g}"),
                      ("One {g} with every field, by id.", "The full record of {a_g}.")),
    "items_in_group": Kind((("group", "int"),), "list",
                           ("list_{ip}_in_{g}", "{ip}_of_{g}", "{g}_{ip}", "get_{g}_{ip}", "{ip}_by_{g}"),
                           ("The {ip} that belong to {a_g}.", "List every {i} of one {g}.")),
    "items_by_category": Kind((("category", "str"),), "list",
                              ("{ip}_by_{c}", "filter_{ip}_by_{c}", "list_{ip}_with_{c}", "find_{ip}_of_{c}"),
                              ("The {ip} of one {c} (exact, case-insensitive).", "Filter the {ip} by {c}.")),
    "items_above": Kind((("min", "int"),), "list",
                        ("{ip}_with_min_{m}", "filter_{ip}_by_{m}", "{ip}_above_{m}", "list_{ip}_over_{m}"),
                        ("The {ip} whose {m} is at least a value.", "Filter the {ip} by a minimum {m}.")),
    "events_of_item": Kind((("item", "int"), ("status", "str")), "list",
                           ("list_{ep}_for_{i}", "{i}_{ep}", "get_{i}_{ep}", "{ep}_of_{i}", "{ep}_by_{i}"),
                           ("The {ep} of one {i}, optionally only those of one {st}.", "List {a_i}'s {ep}."),
                           optional=("status",)),
    "item_totals": Kind((("item", "int"),), "agg",
                        ("{i}_{e}_totals", "total_{ep}_for_{i}", "summarize_{i}_{ep}", "{i}_{a}_total",
                         "sum_{a}_for_{i}"),
                        ("How many {ep} {a_i} has and their total {a}, not counting {cancelled} ones.",
                         "Totals of {a_i}'s {ep} that are not {cancelled}.")),
    "group_stats": Kind((("group", "int"),), "agg",
                        ("{g}_stats", "{g}_{m}_summary", "summarize_{g}", "{g}_statistics", "{m}_stats_for_{g}"),
                        ("Statistics of the {ip} of one {g}: count, average and highest {m}.",
                         "Summarize the {m} of {a_g}'s {ip}.")),
    "group_events": Kind((("group", "int"),), "list",
                         ("list_{ep}_in_{g}", "{g}_{ep}", "{ep}_across_{g}", "get_{g}_{ep}"),
                         ("Every {e} of every {i} of one {g}, with the {i}'s name.",
                          "The {ep} across all {ip} of {a_g}.")),
    "set_item_measure": Kind((("item", "int"), ("value", "int")), "one",
                             ("set_{i}_{m}", "update_{i}_{m}", "change_{i}_{m}", "adjust_{i}_{m}"),
                             ("Set the {m} of {a_i}.", "Change {a_i}'s {m} to a new value."), writes=True),
    "add_event": Kind((("item", "int"), ("amount", "int"), ("date", "str")), "one",
                      ("add_{e}", "create_{e}", "book_{e}", "record_{e}", "new_{e}", "log_{e}"),
                      ("Create {a_e} for {a_i}; its {st} starts as {open}.", "Add a new {e} to {a_i}."),
                      writes=True),
    "set_event_status": Kind((("event", "int"), ("status", "str")), "one",
                             ("set_{e}_{st}", "update_{e}_{st}", "change_{e}_{st}", "mark_{e}"),
                             ("Set the {st} of {a_e}.", "Change {a_e}'s {st}."), writes=True),
}  # fmt: skip

# Argument names by role (``{n}``: the noun of the table a lookup searches).
ARG_NAMES = {
    "text": ("name", "query", "text", "search", "name_contains", "{n}_name"),
    "item": ("{i}_id", "{i}", "{i}_ref", "{i}_key"),
    "group": ("{g}_id", "{g}", "{g}_ref", "{g}_key"),
    "event": ("{e}_id", "{e}", "{e}_ref", "{e}_key"),
    "category": ("{c}", "category", "{c}_value"),
    "min": ("min_{m}", "minimum", "at_least", "{m}_at_least"),
    "value": ("{m}", "new_{m}", "value"),
    "amount": ("{a}", "amount"),
    "date": ("{date}", "date", "day", "on_day"),
    "status": ("{st}", "status", "new_{st}"),
    "status_filter": ("{st}", "status", "only_{st}", "with_{st}"),
}
# A role whose argument is named from another list in one kind of tool: a filter is not a new value.
ARG_PATTERN = {("events_of_item", "status"): "status_filter"}


@dataclass(frozen=True)
class Tool:
    kind: str
    name: str
    args: tuple[tuple[str, str], ...]  # (role, argument name) in signature order
    description: str
    engine: dict  # what the engine reads: kind, arg (role -> name), wrap, count, keys

    def arg(self, role: str) -> str:
        return dict(self.args)[role]

    @property
    def wrap(self) -> str:
        return self.engine["wrap"]


def signature(tools: list[Tool]) -> frozenset[tuple[str, tuple[str, ...]]]:
    """The toolset's signature: ``{(tool name, sorted argument names)}``."""
    return frozenset((t.name, tuple(sorted(a for _, a in t.args))) for t in tools)


def words(world: World) -> dict[str, str]:
    """The tokens names are made of: nouns, column names, statuses."""
    g, i, e = world.group, world.item, world.event
    return {
        "g": g.noun.singular, "gp": g.noun.plural, "i": i.noun.singular, "ip": i.noun.plural,
        "e": e.noun.singular, "ep": e.noun.plural, "m": i.columns["measure"], "a": e.columns["amount"],
        "c": i.columns["category"], "st": e.columns["status"], "date": e.columns["date"],
        "open": world.statuses[0], "cancelled": world.statuses[2],
    }  # fmt: skip


def prose(world: World) -> dict[str, str]:
    """The tokens as descriptions and prompts say them (``_`` as a space, but statuses as the tools
    take them), and ``a_X``: token ``X`` with its article."""
    out = {k: v if k in ("open", "cancelled") else label(v) for k, v in words(world).items()}
    for k in ("g", "i", "e", "a"):
        out[f"a_{k}"] = ("an " if out[k][0] in "aeiou" else "a ") + out[k]
    return out


def _view(world: World, kind: str) -> list[str]:
    """The keys of one row of a tool's result."""
    g, i, e = world.group.columns, world.item.columns, world.event.columns
    return {
        "find_item": [i["id"], i["name"]],
        "find_group": [g["id"], g["name"]],
        "get_item": list(i.values()),
        "get_group": list(g.values()),
        "items_in_group": [i["id"], i["name"], i["category"], i["measure"]],
        "items_by_category": [i["id"], i["name"], i["category"], i["measure"]],
        "items_above": [i["id"], i["name"], i["category"], i["measure"]],
        "events_of_item": [e["id"], e["amount"], e["status"], e["date"]],
        "group_events": [e["id"], e["amount"], e["status"], e["date"], i["name"]],
        "set_item_measure": [i["id"], i["measure"]],
        "add_event": list(e.values()),
        "set_event_status": [e["id"], e["status"]],
    }[kind]


def _shape(rng: random.Random, kind: Kind, w: dict[str, str], name: str) -> dict:
    if kind.returns == "list":
        plural = {"find_group": "{gp}", "events_of_item": "{ep}", "group_events": "{ep}"}.get(name, "{ip}")
        wrap = rng.choice(("", "", "results", plural, "rows")).format(**w)
        return {"wrap": wrap, "count": rng.choice(("", "count", "total")) if wrap else "", "keys": {}}
    if kind.returns == "one":
        return {"wrap": rng.choice(("", "", "record", "result")), "count": "", "keys": {}}
    if name == "item_totals":
        keys = {"count": rng.choice(("count", "{ep}_count", "number_of_{ep}")),
                "sum": rng.choice(("total_{a}", "{a}_total", "sum_{a}"))}  # fmt: skip
    else:
        keys = {"count": rng.choice(("count", "{ip}_count", "number_of_{ip}")),
                "mean": rng.choice(("average_{m}", "avg_{m}", "mean_{m}")),
                "max": rng.choice(("max_{m}", "highest_{m}", "top_{m}"))}  # fmt: skip
    return {"wrap": "", "count": "", "keys": {k: v.format(**w) for k, v in keys.items()}}


def _returns(world: World, tool_kind: str, engine: dict) -> str:
    kind = KINDS[tool_kind]
    if kind.returns == "agg":
        parts = ", ".join(f'"{k}"' for k in engine["keys"].values())
        note = " (the average rounded to 2 decimals)" if tool_kind == "group_stats" else ""
        return f"an object with {parts}{note}"
    keys = ", ".join(_view(world, tool_kind))
    row = f"objects with keys {keys}" if kind.returns == "list" else f"an object with keys {keys}"
    if kind.returns == "list":
        if not engine["wrap"]:
            return f"a list of {row}"
        count = f', "{engine["count"]}": how many there are' if engine["count"] else ""
        return f'an object {{"{engine["wrap"]}": a list of {row}{count}}}'
    return f'{{"{engine["wrap"]}": {row}}}' if engine["wrap"] else row


def _arg_text(role: str, w: dict[str, str], world: World, tool_kind: str) -> str:
    statuses = ", ".join(world.statuses)
    return {
        "text": f"text to look for in the {w['g' if tool_kind == 'find_group' else 'i']}'s name "
        "(case-insensitive)",
        "item": f"the {w['i']}'s id",
        "group": f"the {w['g']}'s id",
        "event": f"the {w['e']}'s id",
        "category": f"the {w['c']} to keep",
        "min": f"the lowest {w['m']} to keep",
        "value": f"the new {w['m']} (an integer, at least 0)",
        "amount": f"the {w['a']} (a positive integer)",
        "date": "the date, YYYY-MM-DD",
        "status": f"one of {statuses}" + (" (empty: every one)" if tool_kind == "events_of_item" else ""),
    }[role]


def draw_tools(rng: random.Random, world: World, kinds: list[str]) -> list[Tool]:
    """Tools of the given kinds (in that order) with names, argument names, descriptions and result
    shapes drawn for ``world``; no two tools share a name."""
    w, said = words(world), prose(world)
    patterns = {role: rng.choice(names) for role, names in ARG_NAMES.items()}
    tools, taken = [], set()
    for tool_kind in kinds:
        kind = KINDS[tool_kind]
        names = [n.format(**w) for n in kind.names]
        rng.shuffle(names)
        name = next((n for n in names if n not in taken), None)
        if name is None:
            raise SynthError(f"no free name for a {tool_kind} tool in a {world.domain.name} environment")
        taken.add(name)
        noun = w["g"] if tool_kind == "find_group" else w["i"]
        args = tuple(
            (role, patterns[ARG_PATTERN.get((tool_kind, role), role)].format(n=noun, **w))
            for role, _ in kind.roles
        )
        bad = [a for _, a in args if keyword.iskeyword(a) or a == "db" or not a.isidentifier()]
        if bad or len({a for _, a in args}) != len(args):
            raise SynthError(f"tool {name}: argument names {[a for _, a in args]} cannot be used")
        engine = {"kind": tool_kind, "arg": dict(args), **_shape(rng, kind, w, tool_kind)}
        lines = [
            rng.choice(kind.phrases).format(**said),
            "",
            "Arguments:",
            *(f"  {a}: {_arg_text(role, said, world, tool_kind)}" for role, a in args),
            f"Returns {_returns(world, tool_kind, engine)}.",
        ]
        tools.append(Tool(tool_kind, name, args, "\n".join(lines), engine))
    return tools


def render(world: World, tools: list[Tool], title: str) -> str:
    """The ``tools.py`` of an environment: the engine, its schema and tools, one function per tool."""
    engine = ENGINE.read_text(encoding="utf-8").split("# ruff: noqa: F821\n", 1)[1]
    head = f'"""{title}"""\n'
    data = (
        f"\n_SCHEMA = json.loads({json.dumps(world.schema(), sort_keys=True)!r})\n"
        f"_TOOLS = json.loads({json.dumps({t.name: t.engine for t in tools}, sort_keys=True)!r})\n"
    )
    functions = []
    for t in tools:
        optional = set(KINDS[t.kind].optional)
        types = dict(KINDS[t.kind].roles)
        params = ", ".join(
            f"{a}: {PY_TYPES[types[role]]}" + (' = ""' if role in optional else "") for role, a in t.args
        )
        doc = "\n".join(f"    {line}".rstrip() for line in t.description.splitlines())
        call = ", ".join(f'"{role}": {a}' for role, a in t.args)
        functions.append(f'\n\ndef {t.name}(db, {params}):\n    """{doc.lstrip()}\n    """\n'
                         f"    return _run(db, {t.name!r}, {{{call}}})\n")  # fmt: skip
    return head + engine + data + "".join(functions)
