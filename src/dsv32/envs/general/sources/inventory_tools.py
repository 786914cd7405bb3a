"""Inventory and order tools over tables products, suppliers, supplier_prices, orders, order_items,
restocks."""


def _rows(db, sql, *args):
    return [dict(r) for r in db.execute(sql, args)]


def list_orders(db, customer=None, status=None):
    sql, args = "SELECT id, customer, status FROM orders WHERE 1 = 1", []
    if customer is not None:
        sql, args = sql + " AND customer = ?", [*args, customer]
    if status is not None:
        sql, args = sql + " AND status = ?", [*args, status]
    return _rows(db, sql + " ORDER BY id", *args)


def get_order(db, order_id):
    order = _rows(db, "SELECT id, customer, status FROM orders WHERE id = ?", order_id)
    if not order:
        raise ValueError(f"no order {order_id!r}")
    items = _rows(db, "SELECT sku, qty FROM order_items WHERE order_id = ? ORDER BY sku", order_id)
    return {**order[0], "items": items}


def get_product(db, sku):
    rows = _rows(
        db, "SELECT sku, name, category, price, stock, reorder_level FROM products WHERE sku = ?", sku
    )
    if not rows:
        raise ValueError(f"no product {sku!r}")
    return rows[0]


def list_products(db, category=None):
    if category is None:
        return _rows(db, "SELECT sku, name, category, price, stock, reorder_level FROM products ORDER BY sku")
    return _rows(
        db,
        "SELECT sku, name, category, price, stock, reorder_level FROM products WHERE category = ? ORDER BY sku",
        category,
    )


def fulfil_order(db, order_id):
    order = get_order(db, order_id)
    if order["status"] != "pending":
        raise ValueError(f"order {order_id} is {order['status']}, not pending")
    for item in order["items"]:
        stock = get_product(db, item["sku"])["stock"]
        if stock < item["qty"]:
            raise ValueError(f"insufficient stock for {item['sku']}: {stock} left, {item['qty']} ordered")
    for item in order["items"]:
        db.execute("UPDATE products SET stock = stock - ? WHERE sku = ?", (item["qty"], item["sku"]))
    db.execute("UPDATE orders SET status = 'fulfilled' WHERE id = ?", (order_id,))
    return f"order {order_id} fulfilled"


def get_supplier_prices(db, sku):
    return _rows(
        db,
        "SELECT s.id AS supplier_id, s.name, p.unit_cost FROM supplier_prices p JOIN suppliers s ON s.id = p.supplier_id"
        " WHERE p.sku = ? ORDER BY s.id",
        sku,
    )


def place_restock(db, sku, supplier_id, qty):
    if not isinstance(qty, int) or qty <= 0:
        raise ValueError("qty must be a positive integer")
    if not _rows(db, "SELECT 1 FROM supplier_prices WHERE sku = ? AND supplier_id = ?", sku, supplier_id):
        raise ValueError(f"supplier {supplier_id!r} does not sell {sku!r}")
    db.execute("INSERT INTO restocks (sku, supplier_id, qty) VALUES (?, ?, ?)", (sku, supplier_id, qty))
    return f"restock of {qty} x {sku} from {supplier_id} placed"
