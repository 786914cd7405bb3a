"""A bundle verifier; bundle.with_params binds ``json`` and the task's ``PARAMS`` above this text."""
# ruff: noqa: F821

import re


def expected(db):
    """The policy of the task, simulated on the initial database."""
    stock = {r["sku"]: r["stock"] for r in db.execute("SELECT sku, stock FROM products")}
    status = {r["id"]: r["status"] for r in db.execute("SELECT id, status FROM orders")}
    price = {r["sku"]: r["price"] for r in db.execute("SELECT sku, price FROM products")}
    total = 0
    for order_id in sorted(
        i for i, s in status.items() if s == "pending" and _customer(db, i) == PARAMS["customer"]
    ):
        items = [
            (r["sku"], r["qty"])
            for r in db.execute("SELECT sku, qty FROM order_items WHERE order_id = ?", (order_id,))
        ]
        if all(stock[sku] >= qty for sku, qty in items):
            for sku, qty in items:
                stock[sku] -= qty
            status[order_id] = "fulfilled"
            total += sum(price[sku] * qty for sku, qty in items)
    restocks = []
    for r in db.execute("SELECT sku, reorder_level FROM products ORDER BY sku"):
        if stock[r["sku"]] < r["reorder_level"]:
            best = db.execute(
                "SELECT supplier_id FROM supplier_prices WHERE sku = ? ORDER BY unit_cost, supplier_id LIMIT 1",
                (r["sku"],),
            ).fetchone()["supplier_id"]
            restocks.append((r["sku"], best, 2 * r["reorder_level"] - stock[r["sku"]]))
    return stock, status, sorted(restocks), round(total, 2)


def _customer(db, order_id):
    return db.execute("SELECT customer FROM orders WHERE id = ?", (order_id,)).fetchone()["customer"]


def verify(initial_db, final_db, answer):
    stock, status, restocks, total = expected(initial_db)
    got_stock = {r["sku"]: r["stock"] for r in final_db.execute("SELECT sku, stock FROM products")}
    got_status = {r["id"]: r["status"] for r in final_db.execute("SELECT id, status FROM orders")}
    got_restocks = sorted(tuple(r) for r in final_db.execute("SELECT sku, supplier_id, qty FROM restocks"))
    assert got_status == status, "the orders' statuses are not the ones the policy gives"
    assert got_stock == stock, "the stock levels are not the ones the policy gives"
    assert got_restocks == restocks, f"the restocks differ from the expected {restocks}"
    numbers = re.findall(r"-?\d[\d,]*\.?\d*", answer or "")
    assert numbers, "the answer states no total"
    assert abs(float(numbers[-1].replace(",", "")) - total) < 0.005, f"the stated total is not {total}"
    return True
