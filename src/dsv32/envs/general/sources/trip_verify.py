"""A bundle verifier; bundle.with_params binds ``json`` and the task's ``PARAMS`` above this text."""
# ruff: noqa: F821


def _item(db, table, item_id):
    row = db.execute(f"SELECT * FROM {table} WHERE id = ?", (item_id,)).fetchone()
    assert row is not None, f"no {table[:-1]} with id {item_id!r}"
    return dict(row)


def _day2_rule(hotel, lunch, dinner, attraction):
    price, ratings = hotel["price_per_night"], (lunch["rating"], dinner["rating"])
    food = lunch["price_per_person"] + dinner["price_per_person"]
    if price >= 800:
        assert food < 350 and min(ratings) >= 4.0 and attraction["ticket_price"] < 120, (
            "day 2 luxury-hotel rule"
        )
    elif price >= 500:
        assert max(ratings) >= 4.0 and attraction["ticket_price"] < 180, "day 2 mid-range-hotel rule"
    else:
        assert max(ratings) >= 3.2, "day 2 budget-hotel rule"


def verify(initial_db, final_db, answer):
    row = final_db.execute("SELECT plan FROM submission").fetchone()
    assert row is not None, "no itinerary was submitted"
    days = json.loads(row["plan"])
    assert len(days) == PARAMS["days"], f"the plan has {len(days)} days, the trip has {PARAMS['days']}"
    seen, total = set(), 0
    for i, day in enumerate(days, 1):
        hotel = _item(initial_db, "hotels", day["hotel_id"])
        attraction = _item(initial_db, "attractions", day["attraction_id"])
        lunch, dinner = (_item(initial_db, "restaurants", day[k]) for k in ("lunch_id", "dinner_id"))
        for kind, item in (
            ("hotel", hotel),
            ("attraction", attraction),
            ("lunch", lunch),
            ("dinner", dinner),
        ):
            assert item["city"] == day["city"], f"day {i}: the {kind} is not in {day['city']}"
        keys = [("city", day["city"]), ("hotel", hotel["id"]), ("attraction", attraction["id"])]
        keys += [("restaurant", lunch["id"]), ("restaurant", dinner["id"])]
        assert not seen & set(keys) and len(set(keys)) == len(keys), (
            f"day {i} repeats a city, hotel, sight or restaurant"
        )
        seen |= set(keys)
        rating = PARAMS["min_restaurant_rating"]
        assert min(lunch["rating"], dinner["rating"]) >= rating, (
            f"day {i}: a restaurant is rated below {rating}"
        )
        if i == 2 and PARAMS["day2_rule"]:
            _day2_rule(hotel, lunch, dinner, attraction)
        total += hotel["price_per_night"] + attraction["ticket_price"]
        total += PARAMS["travellers"] * (lunch["price_per_person"] + dinner["price_per_person"])
    assert days[0]["city"] == PARAMS["start"], f"the trip must start in {PARAMS['start']}"
    assert total <= PARAMS["budget"], f"the plan costs {total}, over the budget of {PARAMS['budget']}"
    return True
