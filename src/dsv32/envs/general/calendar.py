"""Calendar scheduling: book the earliest slot where every participant and a big-enough room are free.

Difficulty ``d``: ``1 + d`` participants, ``1 + d // 2`` candidate days, ``1 + ⌈d/2⌉`` busy events per
person per day, ``2 + d`` rooms with ``1 + ⌊d/2⌋`` bookings a day, from ``d >= 3`` no meeting over lunch (12:00–13:00).
The verifier recomputes the earliest feasible (day, start) on a 15-minute grid from the initial
database and checks the one meeting created, its room, its participants and the stated slot.
"""

from __future__ import annotations

import random
from pathlib import Path

from dsv32.envs.base import tool_schema
from dsv32.envs.general.bundle import write_generated

PEOPLE = ["Ana", "Bo", "Chen", "Dara", "Eli", "Femi", "Gus", "Hana", "Ivo", "Jun"]
TEAMS = ["platform", "research", "sales"]
DAYS = ["2025-10-01", "2025-10-02", "2025-10-03"]
STR = {"type": "string"}
TOOLS = [
    tool_schema("list_people", "Everyone (name, team).", {}),
    tool_schema(
        "get_events", "A person's events on a day (title, start, end as HH:MM).", {"person": STR, "day": STR}
    ),
    tool_schema("list_rooms", "Meeting rooms (name, capacity).", {}),
    tool_schema("get_room_bookings", "A room's bookings on a day (start, end).", {"room": STR, "day": STR}),
    tool_schema(
        "create_meeting",
        "Book a room and add the meeting to each participant's calendar; fails if anyone or the room is busy.",
        {
            "title": STR,
            "day": STR,
            "start": STR,
            "end": STR,
            "participants": {"type": "array", "items": STR},
            "room": STR,
        },
    ),
]


def _hhmm(m: int) -> str:
    return f"{m // 60:02d}:{m % 60:02d}"


def _busy(rng: random.Random, n: int) -> list[tuple[int, int]]:
    spans = []
    for _ in range(n):
        start = rng.randrange(8 * 4, 17 * 4) * 15
        spans.append((start, min(start + rng.choice([30, 45, 60, 90, 120]), 18 * 60)))
    return spans


def _free(spans: list[tuple[int, int]], s: int, e: int) -> bool:
    return all(not (a < e and s < b) for a, b in spans)


def _earliest(days, people_busy, rooms, bookings, duration, size, no_lunch):
    for day in days:
        busy = [span for p in people_busy for span in people_busy[p].get(day, [])]
        busy += [(12 * 60, 13 * 60)] if no_lunch else []
        for s in range(9 * 60, 17 * 60 - duration + 1, 15):
            if _free(busy, s, s + duration):
                for room, cap in rooms:
                    if cap >= size and _free(bookings[room].get(day, []), s, s + duration):
                        return day, s, room
    return None


def generate(rng: random.Random, d: int, task_id: str, out: Path):
    participants = sorted(rng.sample(PEOPLE, 1 + d))
    days, duration, no_lunch = DAYS[: 1 + d // 2], rng.choice([30, 45, 60, 90]), d >= 3
    rooms = [(f"Room {chr(65 + i)}", rng.randrange(2, 9)) for i in range(2 + d)]
    while True:  # redraw the calendars until a slot exists
        people_busy = {p: {day: _busy(rng, 1 + (d + 1) // 2) for day in DAYS} for p in PEOPLE}
        bookings = {room: {day: _busy(rng, 1 + d // 2) for day in DAYS} for room, _ in rooms}
        slot = _earliest(
            days,
            {p: people_busy[p] for p in participants},
            rooms,
            bookings,
            duration,
            len(participants),
            no_lunch,
        )
        if slot is not None and max(c for _, c in rooms) >= len(participants):
            break
    day, start, room = slot
    title = f"{rng.choice(['Roadmap', 'Budget', 'Design', 'Hiring'])} review"
    prompt = (
        f"Schedule a {duration}-minute meeting titled '{title}' with {', '.join(participants)} on the first "
        f"possible day of {', '.join(days)}, within working hours 09:00–17:00"
        + (", not overlapping lunch 12:00–13:00" if no_lunch else "")
        + ". It needs a room that seats everyone and is free. Choose the earliest possible start time on a "
        "15-minute grid (09:00, 09:15, ...), book it with create_meeting, and reply with the day and start time."
    )
    calls = [{"name": "list_rooms", "arguments": {}}]
    calls += [
        {"name": "get_events", "arguments": {"person": p, "day": dd}}
        for dd in days[: days.index(day) + 1]
        for p in participants
    ]
    calls.append({"name": "get_room_bookings", "arguments": {"room": room, "day": day}})
    meeting = {
        "title": title,
        "day": day,
        "start": _hhmm(start),
        "end": _hhmm(start + duration),
        "participants": participants,
        "room": room,
    }
    calls.append({"name": "create_meeting", "arguments": meeting})
    task = {
        "id": task_id, "prompt": prompt, "category": "calendar", "difficulty": d,
        "reference": {"calls": calls, "answer": f"Booked on {day} at {_hhmm(start)} in {room}."},
    }  # fmt: skip
    events = [
        (p, dd, _hhmm(a), _hhmm(b), rng.choice(["1:1", "standup", "focus", "call", "review"]))
        for p in PEOPLE for dd in DAYS for a, b in people_busy[p][dd]
    ]  # fmt: skip
    tables = {
        "people": ("name TEXT PRIMARY KEY, team TEXT", [(p, rng.choice(TEAMS)) for p in PEOPLE]),
        "events": ("person TEXT, day TEXT, start TEXT, end TEXT, title TEXT", events),
        "rooms": ("name TEXT PRIMARY KEY, capacity INTEGER", rooms),
        "bookings": (
            "room TEXT, day TEXT, start TEXT, end TEXT",
            [(r, dd, _hhmm(a), _hhmm(b)) for r, _ in rooms for dd in DAYS for a, b in bookings[r][dd]],
        ),
        "meetings": ("title TEXT, day TEXT, start TEXT, end TEXT, room TEXT, participants TEXT", []),
    }
    params = {
        "title": title,
        "participants": participants,
        "days": days,
        "duration": duration,
        "no_lunch": no_lunch,
    }
    return write_generated(out, task=task, tables=tables, tools_schema=TOOLS, params=params)
