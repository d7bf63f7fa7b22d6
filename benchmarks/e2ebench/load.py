"""The demo shop schema loaded with N parents and 10 N children, and a paced mixed workload.

The workload keeps the live ids in memory (no table scans to pick a row) so one connection can
commit ~1,000 single-change transactions a second. Probe rows (the first customers) are never
deleted: the sampler updates them.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg

SCHEMA_SQL = Path(__file__).resolve().parents[2] / "mappings" / "shop.sql"
PRODUCTS = 100  # with TOASTed descriptions: price updates take the unchanged-TOAST path
TABLES = ("shop.customers", "shop.orders", "shop.products", "shop.order_lines")


def load_rows(pg_url: str, customers: int, orders: int, products: int = PRODUCTS) -> dict[str, int]:
    """Schema + rows, in a few set-based statements; returns rows per table. Every product has a
    TOASTed description (MixedWorkload updates the first PRODUCTS)."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(SCHEMA_SQL.read_text().encode())
        conn.execute(
            "INSERT INTO shop.customers (email, full_name, tier) "
            "SELECT 'user' || g || '@example.com', 'User ' || g, "
            "(ARRAY['standard','gold','platinum'])[1 + g %% 3] FROM generate_series(1, %s) g",
            (customers,),
        )
        conn.execute(
            "INSERT INTO shop.products (sku, name, description, price) "
            "SELECT 'SKU-' || g, 'Product ' || g, repeat('Product ' || g || ' description. ', "
            "150 + g %% 100), (g %% 900 + 1)::numeric FROM generate_series(1, %s) g",
            (products,),
        )
        conn.execute(
            "INSERT INTO shop.orders (customer_id, status, total, internal_note) "
            "SELECT 1 + g %% %s, 'new', (g %% 5000)::numeric / 10, 'not for search' "
            "FROM generate_series(1, %s) g",
            (customers, orders),
        )
        return source_counts(conn)


def insert_fanout_customer(conn: psycopg.Connection[Any], orders: int) -> int:
    """A customer owning `orders` new orders of its own (a rename of it re-renders every one of
    their documents); its id."""
    row = conn.execute(
        "INSERT INTO shop.customers (email, full_name, tier) "
        "VALUES ('fanout@example.com', 'Fan Out', 'gold') RETURNING id"
    ).fetchone()
    assert row is not None
    conn.execute(
        "INSERT INTO shop.orders (customer_id, status, total, internal_note) "
        "SELECT %s, 'new', (g %% 5000)::numeric / 10, 'not for search' "
        "FROM generate_series(1, %s) g",
        (int(row[0]), orders),
    )
    return int(row[0])


def source_counts(conn: psycopg.Connection[Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for table in TABLES:
        row = conn.execute(f"SELECT count(*) FROM {table}".encode()).fetchone()
        counts[table] = int(row[0]) if row else 0
    return counts


@dataclass
class MixedWorkload:
    """Single-row changes, one per transaction, at a target rate (see OPERATIONS)."""

    pg_url: str
    customers: int
    orders: int
    probe_rows: int
    seed: int = 1
    done: Counter[str] = field(default_factory=Counter)
    # Keep every table its size (STEADY_WEIGHTS): for long runs, where a growing index would
    # pass the search stand-in's 10,000-document cliff (docs/performance.md) within minutes.
    steady: bool = False

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.order_ids = list(range(1, self.orders + 1))
        self.customer_count = self.customers
        self.conn = psycopg.connect(self.pg_url, autocommit=True)

    def run(self, rate: float, seconds: float, stop: threading.Event) -> tuple[int, float]:
        """Changes committed and the seconds they took; paced on a fixed schedule."""
        started = time.monotonic()
        committed = 0
        while not stop.is_set():
            due = started + committed / rate
            now = time.monotonic()
            if now - started >= seconds:
                break
            if due > now:
                time.sleep(due - now)
            self.one_change()
            committed += 1
        return committed, time.monotonic() - started

    def one_change(self) -> None:
        operation = self.rng.choices(OPERATIONS, STEADY_WEIGHTS if self.steady else WEIGHTS)[0]
        operation(self)
        self.done[operation.__name__] += 1

    def close(self) -> None:
        self.conn.close()


def insert_order(w: MixedWorkload) -> None:
    row = w.conn.execute(
        "INSERT INTO shop.orders (customer_id, total) VALUES (%s, %s) RETURNING id",
        (w.rng.randint(1, w.customers), Decimal(w.rng.randint(100, 99999)) / 100),
    ).fetchone()
    assert row is not None
    w.order_ids.append(int(row[0]))


def update_order(w: MixedWorkload) -> None:
    w.conn.execute(
        "UPDATE shop.orders SET status = %s WHERE id = %s",
        (w.rng.choice(["paid", "shipped", "cancelled"]), w.rng.choice(w.order_ids)),
    )


def delete_order(w: MixedWorkload) -> None:
    index = w.rng.randrange(len(w.order_ids))
    w.order_ids[index], w.order_ids[-1] = w.order_ids[-1], w.order_ids[index]
    w.conn.execute("DELETE FROM shop.orders WHERE id = %s", (w.order_ids.pop(),))


def insert_customer(w: MixedWorkload) -> None:
    n = w.rng.randrange(10**12)
    w.conn.execute(
        "INSERT INTO shop.customers (email, full_name) VALUES (%s, %s)",
        (f"new{n}@example.com", f"New {n}"),
    )


def update_customer(w: MixedWorkload) -> None:
    # Not the probe rows: the sampler owns their full_name, and a tier change is harmless there
    # too, but keeping them out makes each probe the only writer of its row.
    w.conn.execute(
        "UPDATE shop.customers SET tier = %s, updated_at = now() WHERE id = %s",
        (w.rng.choice(["standard", "gold"]), w.rng.randint(w.probe_rows + 1, w.customers)),
    )


def update_product_price(w: MixedWorkload) -> None:
    """Leaves the TOASTed description out of the change (Debezium's placeholder)."""
    w.conn.execute(
        "UPDATE shop.products SET price = %s, updated_at = now() WHERE id = %s",
        (Decimal(w.rng.randint(100, 99999)) / 100, w.rng.randint(1, PRODUCTS)),
    )


OPERATIONS = [
    insert_order,
    update_order,
    delete_order,
    insert_customer,
    update_customer,
    update_product_price,
]
WEIGHTS = [20, 35, 10, 10, 15, 10]
STEADY_WEIGHTS = [15, 40, 15, 0, 20, 10]  # as many orders inserted as deleted, no new customer
