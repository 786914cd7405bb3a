"""Inventory and order management: fulfil a customer's pending orders in order while stock lasts,
restock what fell below its reorder level from the cheapest supplier, report the fulfilled value.

Difficulty ``d``: ``1 + d`` pending orders of the customer (competing for the same stock from
``d >= 2``, so the order of fulfilment matters and some orders must be skipped), ``4 + 3d`` products,
``2 + d`` suppliers, other customers' orders as distractors. The verifier replays the policy on the
initial database and compares every order's status, every stock level and the set of restocks with
the final database, and the stated total.
"""

from __future__ import annotations

import random
from pathlib import Path

from dsv32.envs.base import tool_schema
from dsv32.envs.general.bundle import write_generated

CUSTOMERS = ["Acme Corp", "Blue Fin", "Cedar & Co", "Delta Labs", "Echo Foods"]
CATEGORIES = ["cable", "sensor", "valve", "switch", "pump"]
STR, INT = {"type": "string"}, {"type": "integer"}
TOOLS = [
    tool_schema(
        "list_orders",
        "Orders (id, customer, status), optionally filtered.",
        {"customer": STR, "status": STR},
        [],
    ),
    tool_schema("get_order", "One order with its items (sku, qty).", {"order_id": INT}),
    tool_schema(
        "get_product", "One product: sku, name, category, price, stock, reorder_level.", {"sku": STR}
    ),
    tool_schema("list_products", "All products, optionally of one category.", {"category": STR}, []),
    tool_schema(
        "fulfil_order",
        "Ship a pending order: fails, changing nothing, if any item lacks stock.",
        {"order_id": INT},
    ),
    tool_schema("get_supplier_prices", "Suppliers of a product with their unit_cost.", {"sku": STR}),
    tool_schema(
        "place_restock",
        "Order qty units of a product from a supplier.",
        {"sku": STR, "supplier_id": STR, "qty": INT},
    ),
]


def _simulate(products: dict, orders: list, items: dict, customer: str, prices: dict):
    """The reference solution: which orders ship, the restocks, the total (as the verifier's policy)."""
    stock = {sku: p[3] for sku, p in products.items()}
    shipped, total = [], 0.0
    for order_id, who, status in orders:
        if who != customer or status != "pending":
            continue
        if all(stock[sku] >= qty for sku, qty in items[order_id]):
            for sku, qty in items[order_id]:
                stock[sku] -= qty
            shipped.append(order_id)
            total += sum(products[sku][2] * qty for sku, qty in items[order_id])
    restocks = []
    for sku in sorted(products):
        if stock[sku] < products[sku][4]:
            supplier = min(prices[sku], key=lambda s: (prices[sku][s], s))
            restocks.append((sku, supplier, 2 * products[sku][4] - stock[sku]))
    return shipped, restocks, round(total, 2)


def generate(rng: random.Random, d: int, task_id: str, out: Path):
    customer = rng.choice(CUSTOMERS)
    products = {}
    for k in range(4 + 3 * d):
        sku = f"SKU-{100 + k}"
        cat = rng.choice(CATEGORIES)
        price = round(rng.uniform(5, 200), 2)
        products[sku] = (sku, f"{cat} model {k}", price, rng.randrange(2, 25), rng.randrange(3, 12), cat)
    suppliers = [(f"SUP{s}", f"Supplier {s}") for s in range(2 + d)]
    prices = {
        sku: {
            s: round(rng.uniform(1, 100), 2)
            for s, _ in rng.sample(suppliers, rng.randrange(1, len(suppliers) + 1))
        }
        for sku in products
    }
    hot = rng.sample(sorted(products), min(len(products), 2 + d // 2))  # contended products
    orders, items = [], {}
    for oid in range(1, 4 + 3 * d):
        who = (
            customer if oid % 2 or rng.random() < 0.3 else rng.choice([c for c in CUSTOMERS if c != customer])
        )
        status = "pending" if rng.random() < 0.85 else rng.choice(["fulfilled", "cancelled"])
        pool = hot if d >= 2 and rng.random() < 0.7 else sorted(products)
        chosen = rng.sample(pool, min(len(pool), rng.randrange(1, 3)))
        items[oid] = [(sku, rng.randrange(1, 4 + 2 * d)) for sku in sorted(chosen)]
        orders.append((oid, who, status))
    shipped, restocks, total = _simulate(products, orders, items, customer, prices)
    prompt = (
        f"Process the pending orders of {customer} in increasing order of id: fulfil each one whose items "
        "are all in stock at that moment and skip the others. Then, for every product whose stock is now "
        "below its reorder level, place one restock with the supplier that offers the lowest unit cost for "
        "it (the lower supplier id on a tie), for (2 × reorder level − stock) units. Finally, reply with the "
        "total value (price × quantity, summed) of the orders you fulfilled."
    )
    calls = [{"name": "list_orders", "arguments": {"customer": customer, "status": "pending"}}]
    calls += [{"name": "fulfil_order", "arguments": {"order_id": oid}} for oid in shipped]
    calls.append({"name": "list_products", "arguments": {}})
    for sku, supplier, qty in restocks:
        calls.append({"name": "get_supplier_prices", "arguments": {"sku": sku}})
        calls.append(
            {"name": "place_restock", "arguments": {"sku": sku, "supplier_id": supplier, "qty": qty}}
        )
    task = {
        "id": task_id, "prompt": prompt, "category": "inventory", "difficulty": d,
        "reference": {"calls": calls, "answer": f"The fulfilled orders total {total:.2f}."},
    }  # fmt: skip
    tables = {
        "products": (
            "sku TEXT PRIMARY KEY, name TEXT, price REAL, stock INTEGER, reorder_level INTEGER, category TEXT",
            list(products.values()),
        ),
        "suppliers": ("id TEXT PRIMARY KEY, name TEXT", suppliers),
        "supplier_prices": (
            "supplier_id TEXT, sku TEXT, unit_cost REAL",
            [(s, sku, c) for sku, by in prices.items() for s, c in by.items()],
        ),
        "orders": ("id INTEGER PRIMARY KEY, customer TEXT, status TEXT", orders),
        "order_items": (
            "order_id INTEGER, sku TEXT, qty INTEGER",
            [(o, s, q) for o, its in items.items() for s, q in its],
        ),
        "restocks": ("id INTEGER PRIMARY KEY AUTOINCREMENT, sku TEXT, supplier_id TEXT, qty INTEGER", []),
    }
    return write_generated(out, task=task, tables=tables, tools_schema=TOOLS, params={"customer": customer})
