"""Trip-planning tools over tables cities, hotels, attractions, restaurants; submit_itinerary writes
the plan into table submission."""

import json


def _rows(db, sql, *args):
    return [dict(r) for r in db.execute(sql, args)]


def get_all_cities(db):
    return [r["name"] for r in _rows(db, "SELECT name FROM cities ORDER BY name")]


def get_hotels_by_city(db, city):
    return _rows(db, "SELECT id, name, price_per_night, rating FROM hotels WHERE city = ? ORDER BY id", city)


def get_attractions_by_city(db, city):
    return _rows(
        db, "SELECT id, name, ticket_price, rating FROM attractions WHERE city = ? ORDER BY id", city
    )


def get_restaurants_by_city(db, city):
    return _rows(
        db, "SELECT id, name, price_per_person, rating FROM restaurants WHERE city = ? ORDER BY id", city
    )


def submit_itinerary(db, days):
    if not isinstance(days, list) or not all(isinstance(d, dict) for d in days):
        raise ValueError("days must be a list of objects, one per day")
    keys = {"city", "hotel_id", "attraction_id", "lunch_id", "dinner_id"}
    for i, day in enumerate(days, 1):
        if set(day) - {"day"} != keys:
            raise ValueError(f"day {i} needs exactly the keys {sorted(keys)}")
    db.execute("DELETE FROM submission")
    db.execute("INSERT INTO submission VALUES (?)", (json.dumps(days),))
    return f"itinerary of {len(days)} day(s) submitted"
