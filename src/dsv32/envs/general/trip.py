"""Trip planning under a budget and conditional constraints, after the paper's synthesized example.

A ``days``-day trip from a start city: each day one city (none repeated), a hotel, an attraction, a
lunch and a dinner restaurant in that city, nothing repeated; restaurants rated at least a minimum;
the whole trip within a budget; from difficulty 3 the paper's day-2 rule (a luxury hotel ≥ 800 caps
food at 350 with both restaurants ≥ 4.0 and a ticket < 120; 500–800 needs one restaurant ≥ 4.0 and
a ticket < 180; cheaper needs one ≥ 3.2). Difficulty ``d`` scales the search: ``1 + ⌈d/2⌉`` days,
``3 + 2d`` cities, ``2 + d`` options of each kind per city, the budget only ``10/d`` % over a planted
feasible plan (which is the reference solution; the verifier accepts any plan that meets every rule).
"""

from __future__ import annotations

import random
from pathlib import Path

from dsv32.envs.base import tool_schema
from dsv32.envs.general.bundle import write_generated

CITIES = [
    "Hangzhou", "Suzhou", "Nanjing", "Shanghai", "Ningbo", "Wuxi", "Shaoxing", "Huangshan",
    "Xiamen", "Qingdao", "Chengdu", "Xi'an", "Guilin", "Kunming", "Dalian",
]  # fmt: skip
TOOLS = [
    tool_schema("get_all_cities", "Names of every city with hotels.", {}),
    tool_schema(
        "get_hotels_by_city",
        "Hotels of a city: id, name, price_per_night, rating.",
        {"city": {"type": "string"}},
    ),
    tool_schema(
        "get_attractions_by_city",
        "Attractions of a city: id, name, ticket_price, rating.",
        {"city": {"type": "string"}},
    ),
    tool_schema(
        "get_restaurants_by_city",
        "Restaurants of a city: id, name, price_per_person, rating.",
        {"city": {"type": "string"}},
    ),
    tool_schema(
        "submit_itinerary",
        "Submit the plan (replaces an earlier one): one object per day, in order.",
        {
            "days": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        k: {"type": "string"}
                        for k in ("city", "hotel_id", "attraction_id", "lunch_id", "dinner_id")
                    },
                },
            }
        },
    ),
]


def _options(rng: random.Random, city: str, n: int, counter: list[int]) -> dict[str, list[tuple]]:
    """Random hotels, attractions, restaurants of one city (rows without the planted ones)."""
    rows: dict[str, list[tuple]] = {"hotels": [], "attractions": [], "restaurants": []}
    for _ in range(n):
        counter[0] += 1
        k = counter[0]
        rows["hotels"].append(
            (f"H{k}", f"{city} Hotel {k}", city, rng.randrange(200, 1400, 10), round(rng.uniform(2.5, 5), 1))
        )
        rows["attractions"].append(
            (f"A{k}", f"{city} Sight {k}", city, rng.randrange(0, 300, 5), round(rng.uniform(3, 5), 1))
        )
        for meal in range(2):
            rows["restaurants"].append(
                (f"R{k}{'ab'[meal]}", f"{city} Kitchen {k}{'ab'[meal]}", city, rng.randrange(40, 400, 5),
                 round(rng.uniform(2.5, 5), 1))
            )  # fmt: skip
    return rows


def generate(rng: random.Random, d: int, task_id: str, out: Path):
    days, travellers = 1 + (d + 1) // 2, 1 + (d >= 4)
    cities = rng.sample(CITIES, min(len(CITIES), 3 + 2 * d))
    counter = [0]
    rows = {"hotels": [], "attractions": [], "restaurants": []}
    for city in cities:
        for table, items in _options(rng, city, 2 + d, counter).items():
            rows[table] += items
    min_rating = 3.0 + 0.2 * d
    plan, cost = [], 0
    for city in cities[:days]:  # the planted feasible plan: it meets every rule
        counter[0] += 1
        k = counter[0]
        hotel = (f"H{k}", f"{city} Inn {k}", city, rng.randrange(300, 900, 10), round(rng.uniform(3.5, 5), 1))
        sight = (f"A{k}", f"{city} Garden {k}", city, rng.randrange(0, 115, 5), round(rng.uniform(3.5, 5), 1))
        meals = [
            (
                f"R{k}{m}",
                f"{city} Table {k}{m}",
                city,
                rng.randrange(40, 170, 5),
                round(rng.uniform(4.0, 5), 1),
            )
            for m in "ab"
        ]
        rows["hotels"].append(hotel)
        rows["attractions"].append(sight)
        rows["restaurants"] += meals
        plan.append(
            {
                "city": city,
                "hotel_id": hotel[0],
                "attraction_id": sight[0],
                "lunch_id": meals[0][0],
                "dinner_id": meals[1][0],
            }
        )
        cost += hotel[3] + sight[3] + travellers * (meals[0][3] + meals[1][3])
    for table in rows:
        rng.shuffle(rows[table])
    params = {
        "days": days,
        "start": cities[0],
        "travellers": travellers,
        "budget": int(cost * (1 + 0.1 / d)),
        "min_restaurant_rating": round(min_rating, 1),
        "day2_rule": d >= 3 and days >= 2,
    }
    prompt = (
        f"Plan a {days}-day trip for {travellers} traveller(s) starting in {cities[0]} (day 1 is spent there). "
        "Each day we stay in one city and need one hotel (one room, one night), one attraction (one ticket "
        "for the group) and two restaurants, lunch and dinner (price per person). Never repeat a city, hotel, "
        "attraction or restaurant, and everything of a day must be in that day's city. Every restaurant must "
        f"be rated at least {params['min_restaurant_rating']}. The whole trip must cost at most "
        f"{params['budget']} CNY."
    )
    if params["day2_rule"]:
        prompt += (
            " On day 2: if the hotel costs 800 CNY or more, lunch and dinner together must cost under 350 per "
            "person, both restaurants must be rated at least 4.0 and the ticket must be under 120; if it costs "
            "500–800, at least one restaurant must be rated 4.0 or more and the ticket must be under 180; if it "
            "costs less than 500, at least one restaurant must be rated 3.2 or more."
        )
    prompt += " Submit the plan with submit_itinerary, then say that it is submitted."
    calls = [{"name": "get_all_cities", "arguments": {}}]
    for city in cities[:days]:
        for tool in ("get_hotels_by_city", "get_attractions_by_city", "get_restaurants_by_city"):
            calls.append({"name": tool, "arguments": {"city": city}})
    calls.append({"name": "submit_itinerary", "arguments": {"days": plan}})
    task = {
        "id": task_id, "prompt": prompt, "category": "trip", "difficulty": d,
        "reference": {"calls": calls, "answer": "The itinerary is submitted."},
    }  # fmt: skip
    tables = {
        "cities": ("name TEXT PRIMARY KEY", [(c,) for c in sorted(cities)]),
        "hotels": (
            "id TEXT PRIMARY KEY, name TEXT, city TEXT, price_per_night INTEGER, rating REAL",
            rows["hotels"],
        ),
        "attractions": (
            "id TEXT PRIMARY KEY, name TEXT, city TEXT, ticket_price INTEGER, rating REAL",
            rows["attractions"],
        ),
        "restaurants": (
            "id TEXT PRIMARY KEY, name TEXT, city TEXT, price_per_person INTEGER, rating REAL",
            rows["restaurants"],
        ),
        "submission": ("plan TEXT", []),
    }
    return write_generated(out, task=task, tables=tables, tools_schema=TOOLS, params=params)
