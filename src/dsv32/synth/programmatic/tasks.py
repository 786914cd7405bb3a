"""Task templates: for an environment's data and tools, a prompt, a ``solution.py`` that may only call
the tools and compute (the synthesis loop's rule), and the verifier's ``PARAMS`` — what the answer must
state and how the database must change — computed from the data the generator drew, not from the
solution, so the solution passing its verifier checks one against the other.

Every template needs 2 to 4 tool calls: it names an entity the model must look up first (a lookup
by name gives the id every other tool takes), then reads, aggregates or changes what belongs to it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from dsv32.synth.programmatic.schema import World
from dsv32.synth.programmatic.toolset import Tool, prose
from dsv32.synth.programmatic.vocab import label

#: Answers a policy could give without doing anything: each must fail every task on the untouched
#: database (checked for every bundle); no expected answer of a task that changes nothing is one of
#: :data:`GUESSES`, nor a number up to :data:`SMALL`.
CONSTANT_ANSWERS = ("", "I could not complete the task.", "0", "1", "yes", "none")
GUESSES = (*CONSTANT_ANSWERS, "2", "3", "no", "unknown", "done", "ok", "true", "false", "N/A")
SMALL = 3


@dataclass
class TaskDraw:
    template: str
    prompt: str
    solution: str  # the source of solution.py
    change: dict | None  # the database change the verifier expects (None: nothing changes)
    answer: dict  # what the verifier expects of the answer
    expected: str  # the expected answer as text (the generator's own check)


Tools = dict[str, Tool]


def _rows(tool: Tool, var: str) -> str:
    return f"{var}[{tool.wrap!r}]" if tool.wrap else var


def _lookup(tool: Tool, name: str, name_col: str, var: str) -> str:
    """Solution lines: search by ``name`` and keep the exact match as ``var``."""
    return (
        f"    found_{var} = tools.{tool.name}({tool.arg('text')}={name!r})\n"
        f"    {var} = [r for r in {_rows(tool, f'found_{var}')} if r[{name_col!r}] == {name!r}][0]\n"
    )


def _solution(body: str) -> str:
    return f'"""The reference solution: only tool calls and computation."""\n\n\ndef solve(tools):\n{body}'


def _fill(rng: random.Random, phrasings: tuple[str, ...], world: World, **values: object) -> str:
    return rng.choice(phrasings).format(**prose(world), **values)


def _number(value: float, tolerance: float = 0.0) -> dict:
    return {"kind": "number", "value": value, "tolerance": tolerance}


def _live_total(world: World, item_id: int) -> int:
    return sum(r["amount"] for r in world.events_of(item_id, live=True))


def _item_total(rng: random.Random, world: World, t: Tools) -> TaskDraw | None:
    find, totals = t["find_item"], t["item_totals"]
    i = world.item.columns
    items = [r for r in world.item.rows if _live_total(world, r["id"]) > SMALL]
    if not items:
        return None
    item = rng.choice(items)
    total = _live_total(world, item["id"])
    prompt = _fill(rng, (
        'What is the total {a} of all {ep} of the {i} "{name}" that are not {cancelled}? Reply with the '
        "number only.",
        'Add up the {a} of every {e} of the {i} named "{name}", leaving out {cancelled} ones. Answer with '
        "just the total.",
    ), world, name=item["name"])  # fmt: skip
    body = _lookup(find, item["name"], i["name"], "item") + (
        f"    totals = tools.{totals.name}({totals.arg('item')}=item[{i['id']!r}])\n"
        f"    return str(totals[{totals.engine['keys']['sum']!r}])\n"
    )
    return TaskDraw("item_total", prompt, _solution(body), None, _number(total), str(total))


def _item_status_total(rng: random.Random, world: World, t: Tools) -> TaskDraw | None:
    find, events = t["find_item"], t["events_of_item"]
    i, e = world.item.columns, world.event.columns
    done = world.statuses[1]
    sums = {r["id"]: sum(x["amount"] for x in world.events_of(r["id"], status=done)) for r in world.item.rows}
    items = [r for r in world.item.rows if sums[r["id"]] > SMALL]
    if not items:
        return None
    item = rng.choice(items)
    prompt = _fill(rng, (
        'What is the total {a} of the {ep} of the {i} "{name}" whose {st} is {done}? Reply with the number '
        "only.",
        'Sum the {a} over the {done} {ep} of the {i} named "{name}" and answer with that number alone.',
    ), world, name=item["name"], done=done)  # fmt: skip
    body = _lookup(find, item["name"], i["name"], "item") + (
        f"    listed = tools.{events.name}({events.arg('item')}=item[{i['id']!r}], "
        f"{events.arg('status')}={done!r})\n"
        f"    return str(sum(r[{e['amount']!r}] for r in {_rows(events, 'listed')}))\n"
    )
    total = sums[item["id"]]
    return TaskDraw("item_status_total", prompt, _solution(body), None, _number(total), str(total))


def _unique_extreme(rows: list[dict], key: str, pick: Callable) -> dict | None:
    best = pick(r[key] for r in rows)
    hits = [r for r in rows if r[key] == best]
    return hits[0] if len(hits) == 1 else None


def _group_extreme(rng: random.Random, world: World, t: Tools) -> TaskDraw | None:
    find, listing = t["find_group"], t["items_in_group"]
    g, i = world.group.columns, world.item.columns
    pick, word = rng.choice(((max, "highest"), (min, "lowest")))
    options = [(gr, _unique_extreme(world.items_of(gr["id"]), "measure", pick)) for gr in world.group.rows]
    options = [(gr, item) for gr, item in options if item is not None]
    if not options:
        return None
    group, item = rng.choice(options)
    prompt = _fill(rng, (
        'Which {i} of the {g} "{group}" has the {word} {m}? Reply with its name only.',
        'In the {g} named "{group}", find the {i} with the {word} {m} and answer with just its name.',
    ), world, group=group["name"], word=word)  # fmt: skip
    body = _lookup(find, group["name"], g["name"], "group") + (
        f"    listed = tools.{listing.name}({listing.arg('group')}=group[{g['id']!r}])\n"
        f"    best = {pick.__name__}({_rows(listing, 'listed')}, key=lambda r: r[{i['measure']!r}])\n"
        f"    return best[{i['name']!r}]\n"
    )
    answer = {"kind": "choice", "value": item["name"], "table": world.item.name, "column": i["name"]}
    return TaskDraw("group_extreme", prompt, _solution(body), None, answer, item["name"])


def _group_average(rng: random.Random, world: World, t: Tools) -> TaskDraw | None:
    find, stats = t["find_group"], t["group_stats"]
    g = world.group.columns
    group = rng.choice(world.group.rows)
    values = [r["measure"] for r in world.items_of(group["id"])]
    mean = round(sum(values) / len(values), 2)
    if mean <= SMALL:
        return None
    prompt = _fill(rng, (
        'What is the average {m} of the {ip} of the {g} "{group}"? Round it to two decimals and reply '
        "with the number only.",
        'Give the mean {m} over the {ip} that belong to the {g} named "{group}", to two decimals. Answer '
        "with the bare number.",
    ), world, group=group["name"])  # fmt: skip
    body = _lookup(find, group["name"], g["name"], "group") + (
        f"    summary = tools.{stats.name}({stats.arg('group')}=group[{g['id']!r}])\n"
        f"    return str(summary[{stats.engine['keys']['mean']!r}])\n"
    )
    return TaskDraw("group_average", prompt, _solution(body), None, _number(mean, 0.006), str(mean))


def _book_event(rng: random.Random, world: World, t: Tools) -> TaskDraw | None:
    find, add = t["find_item"], t["add_event"]
    i, e = world.item.columns, world.event.columns
    item = rng.choice(world.item.rows)
    amount = rng.randint(world.domain.amount.low, world.domain.amount.high)
    day = f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    prompt = _fill(rng, (
        'Add a new {e} for the {i} "{name}" on {day} with {a_a} of {amount}, then reply with the id of '
        "the new {e} only.",
        'Create {a_e} dated {day} for the {i} named "{name}" ({a}: {amount}). Answer with nothing but the '
        "new {e}'s id.",
    ), world, name=item["name"], day=day, amount=amount)  # fmt: skip
    body = _lookup(find, item["name"], i["name"], "item") + (
        f"    created = tools.{add.name}({add.arg('item')}=item[{i['id']!r}], {add.arg('amount')}={amount}, "
        f"{add.arg('date')}={day!r})\n"
        f"    return str({_rows(add, 'created')}[{e['id']!r}])\n"
    )
    values = {e["item"]: item["id"], e["amount"]: amount, e["status"]: world.statuses[0], e["date"]: day}
    change = {"kind": "insert", "table": world.event.name, "values": values}
    new_id = max(r["id"] for r in world.event.rows) + 1
    return TaskDraw("book_event", prompt, _solution(body), change, {"kind": "new_id"}, str(new_id))


def _cancel_above(rng: random.Random, world: World, t: Tools) -> TaskDraw | None:
    find, events, mark = t["find_item"], t["events_of_item"], t["set_event_status"]
    i, e = world.item.columns, world.event.columns
    open_, cancelled = world.statuses[0], world.statuses[2]
    options = []
    for item in world.item.rows:
        amounts = sorted((r["amount"] for r in world.events_of(item["id"], status=open_)), reverse=True)
        for k in (1, 2):
            if k < len(amounts) and amounts[k - 1] > amounts[k]:
                options.append((item, amounts[k]))
            elif k == len(amounts) and amounts[k - 1] > 0:
                options.append((item, amounts[k - 1] - 1))
    if not options:
        return None
    item, threshold = rng.choice(options)
    hit = [r for r in world.events_of(item["id"], status=open_) if r["amount"] > threshold]
    prompt = _fill(rng, (
        'Set every {open} {e} of the {i} "{name}" whose {a} is above {limit} to {cancelled}, then reply '
        "with how many {ep} you changed.",
        'For the {i} named "{name}": each of its {ep} that is still {open} and has {a_a} greater than '
        "{limit} must become {cancelled}. Answer with the number of {ep} you updated.",
    ), world, name=item["name"], limit=threshold)  # fmt: skip
    body = _lookup(find, item["name"], i["name"], "item") + (
        f"    listed = tools.{events.name}({events.arg('item')}=item[{i['id']!r}])\n"
        f"    chosen = [r for r in {_rows(events, 'listed')} if r[{e['status']!r}] == {open_!r} "
        f"and r[{e['amount']!r}] > {threshold}]\n"
        "    for r in chosen:\n"
        f"        tools.{mark.name}({mark.arg('event')}=r[{e['id']!r}], {mark.arg('status')}={cancelled!r})\n"
        "    return str(len(chosen))\n"
    )
    rows = [[r["id"], {e["status"]: cancelled}] for r in hit]
    change = {"kind": "update", "table": world.event.name, "rows": rows}
    return TaskDraw("cancel_above", prompt, _solution(body), change, _number(len(hit)), str(len(hit)))


def _raise_lowest(rng: random.Random, world: World, t: Tools) -> TaskDraw | None:
    find, listing, update = t["find_group"], t["items_in_group"], t["set_item_measure"]
    g, i = world.group.columns, world.item.columns
    options = [(gr, _unique_extreme(world.items_of(gr["id"]), "measure", min)) for gr in world.group.rows]
    options = [(gr, item) for gr, item in options if item is not None]
    if not options:
        return None
    group, item = rng.choice(options)
    m = world.domain.measure
    step = rng.randint(1, max(1, (m.high - m.low) // 5))
    new = item["measure"] + step
    prompt = _fill(rng, (
        'In the {g} "{group}", raise the {m} of the {i} with the lowest {m} by {step}, then reply with '
        "its new {m} only.",
        'Find the {i} with the smallest {m} in the {g} named "{group}" and increase that {m} by {step}. '
        "Answer with the new value alone.",
    ), world, group=group["name"], step=step)  # fmt: skip
    body = _lookup(find, group["name"], g["name"], "group") + (
        f"    listed = tools.{listing.name}({listing.arg('group')}=group[{g['id']!r}])\n"
        f"    low = min({_rows(listing, 'listed')}, key=lambda r: r[{i['measure']!r}])\n"
        f"    tools.{update.name}({update.arg('item')}=low[{i['id']!r}], "
        f"{update.arg('value')}=low[{i['measure']!r}] + {step})\n"
        f"    return str(low[{i['measure']!r}] + {step})\n"
    )
    change = {"kind": "update", "table": world.item.name, "rows": [[item["id"], {i["measure"]: new}]]}
    return TaskDraw("raise_lowest", prompt, _solution(body), change, _number(new), str(new))


def _category_top_total(rng: random.Random, world: World, t: Tools) -> TaskDraw | None:
    by_category, totals = t["items_by_category"], t["item_totals"]
    i = world.item.columns
    options = []
    for category in sorted({r["category"] for r in world.item.rows}):
        rows = [r for r in world.item.rows if r["category"] == category]
        top = _unique_extreme(rows, "measure", max) if len(rows) > 1 else None
        if top is not None and _live_total(world, top["id"]) > SMALL:
            options.append((category, top))
    if not options:
        return None
    category, top = rng.choice(options)
    total = _live_total(world, top["id"])
    prompt = _fill(rng, (
        "Of the {ip} whose {c} is {category}, take the one with the highest {m}: what is the total {a} of "
        "its {ep} that are not {cancelled}? Reply with the number only.",
        "Among the {category} {ip}, find the one with the largest {m} and add up the {a} of its {ep}, "
        "skipping {cancelled} ones. Answer with the total alone.",
    ), world, category=category)  # fmt: skip
    body = (
        f"    listed = tools.{by_category.name}({by_category.arg('category')}={category!r})\n"
        f"    top = max({_rows(by_category, 'listed')}, key=lambda r: r[{i['measure']!r}])\n"
        f"    totals = tools.{totals.name}({totals.arg('item')}=top[{i['id']!r}])\n"
        f"    return str(totals[{totals.engine['keys']['sum']!r}])\n"
    )
    return TaskDraw("category_top_total", prompt, _solution(body), None, _number(total), str(total))


def _item_place(rng: random.Random, world: World, t: Tools) -> TaskDraw | None:
    find, get_item, get_group = t["find_item"], t["get_item"], t["get_group"]
    g, i = world.group.columns, world.item.columns
    item = rng.choice(world.item.rows)
    place = world.group.by_id(item["group"])["place"]
    prompt = _fill(rng, (
        'What is the {place} of the {g} that the {i} "{name}" belongs to? Reply with the {place} only.',
        'The {i} named "{name}" is part of {a_g}. Which {place} is that {g} in? Answer with just the '
        "{place}.",
    ), world, name=item["name"], place=label(g["place"]))  # fmt: skip
    body = _lookup(find, item["name"], i["name"], "item") + (
        f"    record = tools.{get_item.name}({get_item.arg('item')}=item[{i['id']!r}])\n"
        f"    owner = tools.{get_group.name}({get_group.arg('group')}={_rows(get_item, 'record')}[{i['group']!r}])\n"
        f"    return {_rows(get_group, 'owner')}[{g['place']!r}]\n"
    )
    answer = {"kind": "choice", "value": place, "table": world.group.name, "column": g["place"]}
    return TaskDraw("item_place", prompt, _solution(body), None, answer, place)


def _group_done_total(rng: random.Random, world: World, t: Tools) -> TaskDraw | None:
    find, events = t["find_group"], t["group_events"]
    g, e = world.group.columns, world.event.columns
    done = world.statuses[1]
    sums = {
        gr["id"]: sum(
            x["amount"] for it in world.items_of(gr["id"]) for x in world.events_of(it["id"], status=done)
        )
        for gr in world.group.rows
    }
    groups = [gr for gr in world.group.rows if sums[gr["id"]] > SMALL]
    if not groups:
        return None
    group = rng.choice(groups)
    prompt = _fill(rng, (
        'What is the total {a} of the {done} {ep} across all {ip} of the {g} "{group}"? Reply with the '
        "number only.",
        'Add up the {a} of every {e} whose {st} is {done}, over all {ip} in the {g} named "{group}". '
        "Answer with the sum alone.",
    ), world, group=group["name"], done=done)  # fmt: skip
    body = _lookup(find, group["name"], g["name"], "group") + (
        f"    listed = tools.{events.name}({events.arg('group')}=group[{g['id']!r}])\n"
        f"    return str(sum(r[{e['amount']!r}] for r in {_rows(events, 'listed')} if r[{e['status']!r}] == {done!r}))\n"
    )
    total = sums[group["id"]]
    return TaskDraw("group_done_total", prompt, _solution(body), None, _number(total), str(total))


Template = Callable[[random.Random, World, Tools], "TaskDraw | None"]
#: Each template with the tool kinds it needs.
TEMPLATES: dict[str, tuple[tuple[str, ...], Template]] = {
    "item_total": (("find_item", "item_totals"), _item_total),
    "item_status_total": (("find_item", "events_of_item"), _item_status_total),
    "group_extreme": (("find_group", "items_in_group"), _group_extreme),
    "group_average": (("find_group", "group_stats"), _group_average),
    "book_event": (("find_item", "add_event"), _book_event),
    "cancel_above": (("find_item", "events_of_item", "set_event_status"), _cancel_above),
    "raise_lowest": (("find_group", "items_in_group", "set_item_measure"), _raise_lowest),
    "category_top_total": (("items_by_category", "item_totals"), _category_top_total),
    "item_place": (("find_item", "get_item", "get_group"), _item_place),
    "group_done_total": (("find_group", "group_events"), _group_done_total),
}
