"""The tool engine of a programmatic environment: the top of its ``tools.py``, followed there by
``_SCHEMA`` (the tables' names and columns), ``_TOOLS`` (each tool's kind and result keys) and one
public function per tool. Standard library only: it runs in the sandbox as ``python -I -S``.

Every table and column name comes from ``_SCHEMA``, never from an argument; every value a model
passes is bound as an SQL parameter and checked for its type first."""
# ruff: noqa: F821

import datetime
import json


def _q(name):
    return '"' + name + '"'


def _int(value, what):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an integer, got {json.dumps(value)}")
    return value


def _str(value, what):
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, got {json.dumps(value)}")
    return value


def _select(db, role, columns, where="", args=()):
    t = _SCHEMA[role]
    names = [t[c] for c in columns]
    sql = f"SELECT {', '.join(_q(n) for n in names)} FROM {_q(t['table'])} {where} ORDER BY {_q(t['id'])}"
    return [dict(zip(names, row)) for row in db.execute(sql, args)]


def _one(db, role, key, what):
    t = _SCHEMA[role]
    rows = _select(db, role, t["columns"], f"WHERE {_q(t['id'])} = ?", (key,))
    if not rows:
        raise LookupError(f"there is no {t['noun']} with {what} {key}")
    return rows[0]


def _many(tool, rows):
    if not tool["wrap"]:
        return rows
    return {tool["wrap"]: rows, tool["count"]: len(rows)} if tool["count"] else {tool["wrap"]: rows}


def _single(tool, row):
    return {tool["wrap"]: row} if tool["wrap"] else row


def _find(role):
    def run(db, tool, a):
        text = _str(a["text"], tool["arg"]["text"]).strip()
        name = _q(_SCHEMA[role]["name"])
        return _many(tool, _select(db, role, ["id", "name"], f"WHERE {name} LIKE ?", (f"%{text}%",)))

    return run


def _get(role):
    def run(db, tool, a):
        return _single(tool, _one(db, role, _int(a[role], tool["arg"][role]), tool["arg"][role]))

    return run


_ITEM_VIEW = ["id", "name", "category", "measure"]
_EVENT_VIEW = ["id", "amount", "status", "date"]


def _items_in_group(db, tool, a):
    group = _int(a["group"], tool["arg"]["group"])
    _one(db, "group", group, tool["arg"]["group"])
    where = f"WHERE {_q(_SCHEMA['item']['group'])} = ?"
    return _many(tool, _select(db, "item", _ITEM_VIEW, where, (group,)))


def _items_by_category(db, tool, a):
    value = _str(a["category"], tool["arg"]["category"]).strip()
    where = f"WHERE lower({_q(_SCHEMA['item']['category'])}) = lower(?)"
    return _many(tool, _select(db, "item", _ITEM_VIEW, where, (value,)))


def _items_above(db, tool, a):
    low = _int(a["min"], tool["arg"]["min"])
    where = f"WHERE {_q(_SCHEMA['item']['measure'])} >= ?"
    return _many(tool, _select(db, "item", _ITEM_VIEW, where, (low,)))


def _events_of_item(db, tool, a):
    item = _int(a["item"], tool["arg"]["item"])
    _one(db, "item", item, tool["arg"]["item"])
    status = _str(a.get("status", ""), tool["arg"]["status"]).strip()
    where, args = f"WHERE {_q(_SCHEMA['event']['item'])} = ?", [item]
    if status:
        where, args = where + f" AND {_q(_SCHEMA['event']['status'])} = ?", [item, status]
    return _many(tool, _select(db, "event", _EVENT_VIEW, where, tuple(args)))


def _item_totals(db, tool, a):
    item = _int(a["item"], tool["arg"]["item"])
    _one(db, "item", item, tool["arg"]["item"])
    e = _SCHEMA["event"]
    count, total = db.execute(
        f"SELECT COUNT(*), COALESCE(SUM({_q(e['amount'])}), 0) FROM {_q(e['table'])} "
        f"WHERE {_q(e['item'])} = ? AND {_q(e['status'])} != ?",
        (item, _SCHEMA["statuses"][2]),
    ).fetchone()
    return {tool["keys"]["count"]: count, tool["keys"]["sum"]: total}


def _group_stats(db, tool, a):
    group = _int(a["group"], tool["arg"]["group"])
    _one(db, "group", group, tool["arg"]["group"])
    i = _SCHEMA["item"]
    count, mean, top = db.execute(
        f"SELECT COUNT(*), AVG({_q(i['measure'])}), MAX({_q(i['measure'])}) FROM {_q(i['table'])} "
        f"WHERE {_q(i['group'])} = ?",
        (group,),
    ).fetchone()
    keys = tool["keys"]
    return {keys["count"]: count, keys["mean"]: None if mean is None else round(mean, 2), keys["max"]: top}


def _group_events(db, tool, a):
    group = _int(a["group"], tool["arg"]["group"])
    _one(db, "group", group, tool["arg"]["group"])
    e, i = _SCHEMA["event"], _SCHEMA["item"]
    cols = [e["id"], e["amount"], e["status"], e["date"]]
    sql = (
        f"SELECT {', '.join('e.' + _q(c) for c in cols)}, i.{_q(i['name'])} FROM {_q(e['table'])} AS e "
        f"JOIN {_q(i['table'])} AS i ON e.{_q(e['item'])} = i.{_q(i['id'])} "
        f"WHERE i.{_q(i['group'])} = ? ORDER BY e.{_q(e['id'])}"
    )
    names = [*cols, i["name"]]
    return _many(tool, [dict(zip(names, row)) for row in db.execute(sql, (group,))])


def _set_item_measure(db, tool, a):
    item = _int(a["item"], tool["arg"]["item"])
    value = _int(a["value"], tool["arg"]["value"])
    if value < 0:
        raise ValueError(f"{tool['arg']['value']} must not be negative")
    _one(db, "item", item, tool["arg"]["item"])
    i = _SCHEMA["item"]
    db.execute(f"UPDATE {_q(i['table'])} SET {_q(i['measure'])} = ? WHERE {_q(i['id'])} = ?", (value, item))
    return _single(tool, {i["id"]: item, i["measure"]: value})


def _add_event(db, tool, a):
    item = _int(a["item"], tool["arg"]["item"])
    amount = _int(a["amount"], tool["arg"]["amount"])
    day = _str(a["date"], tool["arg"]["date"]).strip()
    if amount <= 0:
        raise ValueError(f"{tool['arg']['amount']} must be positive")
    try:
        day = datetime.date.fromisoformat(day).isoformat()
    except ValueError:
        raise ValueError(f"{tool['arg']['date']} must be a date written YYYY-MM-DD") from None
    _one(db, "item", item, tool["arg"]["item"])
    e = _SCHEMA["event"]
    (last,) = db.execute(f"SELECT COALESCE(MAX({_q(e['id'])}), 0) FROM {_q(e['table'])}").fetchone()
    row = {"id": last + 1, "item": item, "amount": amount, "status": _SCHEMA["statuses"][0], "date": day}
    names = [e[c] for c in row]
    marks = ", ".join("?" * len(row))
    db.execute(f"INSERT INTO {_q(e['table'])} ({', '.join(_q(n) for n in names)}) VALUES ({marks})",
               tuple(row.values()))  # fmt: skip
    return _single(tool, dict(zip(names, row.values())))


def _set_event_status(db, tool, a):
    event = _int(a["event"], tool["arg"]["event"])
    status = _str(a["status"], tool["arg"]["status"]).strip()
    if status not in _SCHEMA["statuses"]:
        raise ValueError(f"{tool['arg']['status']} must be one of {', '.join(_SCHEMA['statuses'])}")
    _one(db, "event", event, tool["arg"]["event"])
    e = _SCHEMA["event"]
    db.execute(f"UPDATE {_q(e['table'])} SET {_q(e['status'])} = ? WHERE {_q(e['id'])} = ?", (status, event))
    return _single(tool, {e["id"]: event, e["status"]: status})


_KINDS = {
    "find_item": _find("item"),
    "find_group": _find("group"),
    "get_item": _get("item"),
    "get_group": _get("group"),
    "items_in_group": _items_in_group,
    "items_by_category": _items_by_category,
    "items_above": _items_above,
    "events_of_item": _events_of_item,
    "item_totals": _item_totals,
    "group_stats": _group_stats,
    "group_events": _group_events,
    "set_item_measure": _set_item_measure,
    "add_event": _add_event,
    "set_event_status": _set_event_status,
}


def _run(db, name, arguments):
    tool = _TOOLS[name]
    return _KINDS[tool["kind"]](db, tool, arguments)
