"""A bundle verifier; bundle.with_params binds ``json`` and the task's ``PARAMS`` above this text."""
# ruff: noqa: F821


def _m(hhmm):
    h, m = hhmm.split(":")
    return int(h) * 60 + int(m)


def _free(intervals, s, e):
    return all(not (_m(a) < e and s < _m(b)) for a, b in intervals)


def earliest(db):
    """The first (day, start) on the 15-minute grid where everyone and some big-enough room are free."""
    dur, p = PARAMS["duration"], PARAMS
    rooms = [
        r["name"] for r in db.execute("SELECT name FROM rooms WHERE capacity >= ?", (len(p["participants"]),))
    ]
    for day in p["days"]:
        busy = [(r["start"], r["end"]) for r in db.execute(
            f"SELECT start, end FROM events WHERE day = ? AND person IN ({','.join('?' * len(p['participants']))})",
            (day, *p["participants"]))]  # fmt: skip
        if p["no_lunch"]:
            busy.append(("12:00", "13:00"))
        for s in range(9 * 60, 17 * 60 - dur + 1, 15):
            if not _free(busy, s, s + dur):
                continue
            for room in rooms:
                booked = [
                    (r["start"], r["end"])
                    for r in db.execute(
                        "SELECT start, end FROM bookings WHERE room = ? AND day = ?", (room, day)
                    )
                ]
                if _free(booked, s, s + dur):
                    return day, s
    return None


def verify(initial_db, final_db, answer):
    slot = earliest(initial_db)
    assert slot is not None, "the task has no feasible slot (a broken bundle)"
    day, start = slot
    hhmm = f"{start // 60:02d}:{start % 60:02d}"
    rows = [dict(r) for r in final_db.execute("SELECT * FROM meetings WHERE title = ?", (PARAMS["title"],))]
    assert len(rows) == 1, f"expected one meeting titled {PARAMS['title']!r}, found {len(rows)}"
    meeting = rows[0]
    assert (meeting["day"], meeting["start"]) == (day, hhmm), f"the earliest possible slot is {day} {hhmm}"
    assert _m(meeting["end"]) - _m(meeting["start"]) == PARAMS["duration"], "the meeting has the wrong length"
    assert meeting["participants"] == ",".join(sorted(PARAMS["participants"])), "the participants differ"
    cap = initial_db.execute("SELECT capacity FROM rooms WHERE name = ?", (meeting["room"],)).fetchone()
    assert cap is not None and cap["capacity"] >= len(PARAMS["participants"]), "the room is too small"
    assert hhmm in (answer or "") and day in (answer or ""), f"the answer does not state {day} {hhmm}"
    return True
