"""A random mixed workload on the demo shop schema: inserts, updates, deletes, one per transaction.

Covers what the sinks must get right: composite keys (order_lines), cascaded deletes, deletes
followed by re-inserts of the same key, and updates that leave the TOASTed product description
unchanged (Debezium sends `__debezium_unavailable_value` for it).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

Operation = Callable[[psycopg.Connection[Any], random.Random], str | None]
SCHEMA_SQL = "mappings/shop.sql"
SEED_SQL = "mappings/shop_seed.sql"


def _pick(conn: psycopg.Connection[Any], sql: str, rng: random.Random) -> Any:
    rows = conn.execute(sql).fetchall()
    return rng.choice(rows) if rows else None


def insert_customer(conn: psycopg.Connection[Any], rng: random.Random) -> str:
    n = rng.randrange(10**9)
    conn.execute(
        "INSERT INTO shop.customers (email, full_name, tier) VALUES (%s, %s, %s)",
        (f"user{n}@example.com", f"User {n}", rng.choice(["standard", "gold"])),
    )
    return "insert customer"


def update_customer(conn: psycopg.Connection[Any], rng: random.Random) -> str | None:
    row = _pick(conn, "SELECT id FROM shop.customers", rng)
    if row is None:
        return None
    conn.execute(
        "UPDATE shop.customers SET tier = %s, updated_at = now() WHERE id = %s",
        (rng.choice(["standard", "gold", "platinum"]), row[0]),
    )
    return "update customer"


def delete_customer(conn: psycopg.Connection[Any], rng: random.Random) -> str | None:
    row = _pick(conn, "SELECT id FROM shop.customers", rng)
    if row is None:
        return None
    conn.execute("DELETE FROM shop.customers WHERE id = %s", (row[0],))  # cascades to orders
    return "delete customer (cascade)"


def insert_product(conn: psycopg.Connection[Any], rng: random.Random) -> str:
    n = rng.randrange(10**9)
    conn.execute(
        "INSERT INTO shop.products (sku, name, description, price, attributes) "
        "VALUES (%s, %s, %s, %s, %s)",
        (
            f"SKU-{n}",
            f"Product {n}",
            f"Product {n} description. " * rng.randint(100, 400),
            Decimal(rng.randint(100, 99999)) / 100,
            Jsonb({"batch": n % 7}),
        ),
    )
    return "insert product"


def update_product_price(conn: psycopg.Connection[Any], rng: random.Random) -> str | None:
    """Leaves the TOASTed description untouched: the TOAST-merge path."""
    row = _pick(conn, "SELECT id FROM shop.products", rng)
    if row is None:
        return None
    conn.execute(
        "UPDATE shop.products SET price = %s, updated_at = now() WHERE id = %s",
        (Decimal(rng.randint(100, 99999)) / 100, row[0]),
    )
    return "update product price (TOAST unchanged)"


def update_product_description(conn: psycopg.Connection[Any], rng: random.Random) -> str | None:
    row = _pick(conn, "SELECT id FROM shop.products", rng)
    if row is None:
        return None
    conn.execute(
        "UPDATE shop.products SET description = %s WHERE id = %s",
        (f"Rewritten {rng.randrange(10**6)}. " * 300, row[0]),
    )
    return "update product description"


def insert_order(conn: psycopg.Connection[Any], rng: random.Random) -> str | None:
    customer = _pick(conn, "SELECT id FROM shop.customers", rng)
    products = conn.execute("SELECT id, price FROM shop.products").fetchall()
    if customer is None or not products:
        return None
    lines = rng.sample(products, k=min(len(products), rng.randint(1, 3)))
    total = sum((price for _, price in lines), Decimal(0))
    order_id = conn.execute(
        "INSERT INTO shop.orders (customer_id, total, internal_note) VALUES (%s, %s, %s) "
        "RETURNING id",
        (customer[0], total, "not for search"),
    ).fetchone()
    assert order_id is not None
    for line_no, (product_id, price) in enumerate(lines, start=1):
        conn.execute(
            "INSERT INTO shop.order_lines (order_id, line_no, product_id, quantity, unit_price) "
            "VALUES (%s, %s, %s, %s, %s)",
            (order_id[0], line_no, product_id, rng.randint(1, 5), price),
        )
    return "insert order with lines"


def update_order_line(conn: psycopg.Connection[Any], rng: random.Random) -> str | None:
    row = _pick(conn, "SELECT order_id, line_no FROM shop.order_lines", rng)
    if row is None:
        return None
    conn.execute(
        "UPDATE shop.order_lines SET quantity = quantity + 1 WHERE order_id = %s AND line_no = %s",
        row,
    )
    return "update order line (composite key)"


def delete_order_line(conn: psycopg.Connection[Any], rng: random.Random) -> str | None:
    row = _pick(conn, "SELECT order_id, line_no FROM shop.order_lines", rng)
    if row is None:
        return None
    conn.execute("DELETE FROM shop.order_lines WHERE order_id = %s AND line_no = %s", row)
    return "delete order line (composite key)"


def update_order_status(conn: psycopg.Connection[Any], rng: random.Random) -> str | None:
    row = _pick(conn, "SELECT id FROM shop.orders", rng)
    if row is None:
        return None
    conn.execute(
        "UPDATE shop.orders SET status = %s WHERE id = %s",
        (rng.choice(["paid", "shipped", "cancelled"]), row[0]),
    )
    return "update order status"


def delete_and_reinsert_product(conn: psycopg.Connection[Any], rng: random.Random) -> str | None:
    """Same primary key deleted then inserted again: the re-insert must win in every sink."""
    row = _pick(
        conn,
        "SELECT id, sku FROM shop.products p WHERE NOT EXISTS "
        "(SELECT 1 FROM shop.order_lines l WHERE l.product_id = p.id)",
        rng,
    )
    if row is None:
        return None
    conn.execute("DELETE FROM shop.products WHERE id = %s", (row[0],))
    conn.execute(
        "INSERT INTO shop.products (id, sku, name, description, price) VALUES (%s, %s, %s, %s, %s)",
        (row[0], row[1], "Reinserted", "Back again. " * 300, Decimal("1.00")),
    )
    return "delete + re-insert product (same key, one transaction)"


def toggle_product_stock(conn: psycopg.Connection[Any], rng: random.Random) -> str | None:
    """Out of stock, or back: the product leaves or re-enters the in-stock index
    (mappings/shop.yaml), its TOASTed description unchanged (a placeholder, filled first)."""
    row = _pick(conn, "SELECT id FROM shop.products", rng)
    if row is None:
        return None
    conn.execute("UPDATE shop.products SET in_stock = NOT in_stock WHERE id = %s", row)
    return "toggle product stock (filtered index, TOAST unchanged)"


OPERATIONS: list[tuple[Operation, int]] = [
    (insert_customer, 3),
    (update_customer, 4),
    (delete_customer, 1),
    (insert_product, 2),
    (update_product_price, 4),
    (update_product_description, 1),
    (insert_order, 4),
    (update_order_line, 3),
    (delete_order_line, 2),
    (update_order_status, 3),
    (delete_and_reinsert_product, 1),
    (toggle_product_stock, 2),
]


def run_workload(pg_url: str, operations: int, seed: int = 7) -> Counter[str]:
    """Run `operations` random operations, each in its own transaction; returns what ran."""
    rng = random.Random(seed)
    done: Counter[str] = Counter()
    functions = [op for op, _ in OPERATIONS]
    weights = [w for _, w in OPERATIONS]
    with psycopg.connect(pg_url) as conn:
        for _ in range(operations):
            operation = rng.choices(functions, weights)[0]
            with conn.transaction():
                label = operation(conn, rng)
            if label:
                done[label] += 1
    return done


def create_demo_schema(pg_url: str, root: str = ".", seed_rows: bool = True) -> None:
    from pathlib import Path

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(Path(root, SCHEMA_SQL).read_text().encode())
        if seed_rows:
            conn.execute(Path(root, SEED_SQL).read_text().encode())
