"""Calendar tools over tables people, events, rooms, bookings; create_meeting books a room and adds
the meeting to every participant's calendar (table meetings records it)."""


def _rows(db, sql, *args):
    return [dict(r) for r in db.execute(sql, args)]


def _minutes(hhmm):
    h, m = hhmm.split(":")
    return int(h) * 60 + int(m)


def list_people(db):
    return _rows(db, "SELECT name, team FROM people ORDER BY name")


def get_events(db, person, day):
    if not _rows(db, "SELECT 1 FROM people WHERE name = ?", person):
        raise ValueError(f"no person {person!r}")
    return _rows(
        db, "SELECT title, start, end FROM events WHERE person = ? AND day = ? ORDER BY start", person, day
    )


def list_rooms(db):
    return _rows(db, "SELECT name, capacity FROM rooms ORDER BY name")


def get_room_bookings(db, room, day):
    return _rows(db, "SELECT start, end FROM bookings WHERE room = ? AND day = ? ORDER BY start", room, day)


def create_meeting(db, title, day, start, end, participants, room):
    if not isinstance(participants, list) or not participants:
        raise ValueError("participants must be a non-empty list of names")
    s, e = _minutes(start), _minutes(end)
    if e <= s:
        raise ValueError("the meeting must end after it starts")
    for person in participants:
        for ev in get_events(db, person, day):
            if _minutes(ev["start"]) < e and s < _minutes(ev["end"]):
                raise ValueError(f"{person} is busy {ev['start']}-{ev['end']} ({ev['title']})")
    cap = _rows(db, "SELECT capacity FROM rooms WHERE name = ?", room)
    if not cap:
        raise ValueError(f"no room {room!r}")
    for b in get_room_bookings(db, room, day):
        if _minutes(b["start"]) < e and s < _minutes(b["end"]):
            raise ValueError(f"room {room} is booked {b['start']}-{b['end']}")
    db.execute("INSERT INTO bookings VALUES (?, ?, ?, ?)", (room, day, start, end))
    for person in participants:
        db.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?)", (person, day, start, end, title))
    db.execute(
        "INSERT INTO meetings VALUES (?, ?, ?, ?, ?, ?)",
        (title, day, start, end, room, ",".join(sorted(participants))),
    )
    return f"{title!r} booked on {day} {start}-{end} in {room}"
