"""The document benchmark's rows and workload (benchmarks/bench_documents.py).

Rows: e2ebench/load.py's customers, products and orders (all `new`: none is cancelled, so the
root filter `status <> 'cancelled'` keeps every order and pgsync, which cannot filter, indexes
the same orders), one fan-out customer with its own orders, and 1-5 lines per order (3 on
average) over all products. Workload: single-row changes to the documents' CHILD tables only
(lines, products, customers; never an order), paced by MixedWorkload.run. Rows the probes write
(`Reserved`) are left alone, so each probe is the only writer of its row.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg

from cdc_sync.core.model import TableId
from cdc_sync.documents.target import document_route
from cdc_sync.mapping import MappingFile
from cdc_sync.relations import DocumentSpec
from cdc_sync.schema import RowSchema
from cdc_sync.schema.catalog import ConverterModes, row_schema_from_catalog
from e2ebench.load import (
    PRODUCTS,
    MixedWorkload,
    insert_fanout_customer,
    load_rows,
    source_counts,
)

DOCUMENT = "shop_order_documents"  # the demo mapping's document index (mappings/shop.yaml)
MAX_LINES = 5  # lines per order: 1 + id % 5


@dataclass(frozen=True)
class DocumentRows:
    counts: dict[str, int]  # rows per table
    fanout_customer: int  # the customer with `fanout` orders
    roots: int  # root rows (orders)
    expected: int  # root rows the document's filter keeps: its documents


def load_document_rows(
    pg_url: str,
    spec: DocumentSpec,
    customers: int,
    orders: int,
    products: int,
    fanout: int,
) -> DocumentRows:
    """Schema + rows in set-based statements (load_rows, then the fan-out customer, then the
    lines); the documents expected are counted with the spec's own filter."""
    load_rows(pg_url, customers, orders, products)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        fanout_customer = insert_fanout_customer(conn, fanout)
        # Line 1 of orders 1, 2, ... holds products 38, 39, ...: the probes' orders get
        # distinct products (docprobe.probe_targets checks it).
        conn.execute(
            "INSERT INTO shop.order_lines (order_id, line_no, product_id, quantity, unit_price) "
            "SELECT o.id, n, 1 + (o.id + 37 * n) %% %s, 1 + (o.id + n) %% 9, "
            "((o.id * n) %% 900 + 1)::numeric FROM shop.orders o "
            "CROSS JOIN LATERAL generate_series(1, 1 + o.id %% %s) n",
            (products, MAX_LINES),
        )
        counts = source_counts(conn)
        roots = _count(conn, f"SELECT count(*) FROM {spec.table}")
        where = f" WHERE {spec.filter}" if spec.filter else ""
        expected = _count(conn, f"SELECT count(*) FROM {spec.table}{where}")
    return DocumentRows(counts, fanout_customer, roots, expected)


def _count(conn: psycopg.Connection[Any], sql: str) -> int:
    row = conn.execute(sql.encode()).fetchone()
    return int(row[0]) if row else 0


def document_properties(
    pg_url: str, mapping: MappingFile, connector: Path, name: str
) -> dict[str, Any]:
    """The index mapping's properties cdc-sync derives for document `name` (each level typed
    from the catalog as the connector encodes it), to give pgsync's index the same types."""
    spec = mapping.documents[name]
    config = json.loads(connector.read_text())["config"]
    modes = ConverterModes.from_connector(config)
    with psycopg.connect(pg_url) as conn:
        schemas: dict[TableId, RowSchema] = {
            table: row_schema_from_catalog(conn, table, modes) for table in spec.tables()
        }
    route = document_route(spec, schemas, mapping.policies_for(spec.table))
    assert route.search is not None
    return dict(route.search.mapping["properties"])


@dataclass(frozen=True)
class Reserved:
    """Rows only the probes write: their orders' lines, their customers, their products."""

    orders: frozenset[int] = frozenset()
    customers: frozenset[int] = frozenset()
    products: frozenset[int] = frozenset()


@dataclass
class ChildWorkload(MixedWorkload):
    """MixedWorkload's pacing with changes to the documents' child tables (CHILD_OPERATIONS).
    Knows the live lines (read once, at start) so it never scans a table to pick a row."""

    products: int = PRODUCTS
    reserved: Reserved = field(default_factory=Reserved)

    def __post_init__(self) -> None:
        super().__post_init__()
        found = self.conn.execute("SELECT order_id, line_no FROM shop.order_lines").fetchall()
        self.lines: list[tuple[int, int]] = []
        self.next_line: dict[int, int] = {}
        for order_id, line_no in found:
            if order_id in self.reserved.orders:
                continue
            self.lines.append((int(order_id), int(line_no)))
            self.next_line[order_id] = max(self.next_line.get(order_id, 1), line_no + 1)
        self.line_orders = sorted(self.next_line)
        self.customer_ids = [
            c for c in range(1, self.customers + 1) if c not in self.reserved.customers
        ]
        self.product_ids = [
            p for p in range(1, self.products + 1) if p not in self.reserved.products
        ]

    def one_change(self) -> None:
        operation = self.rng.choices(CHILD_OPERATIONS, CHILD_WEIGHTS)[0]
        operation(self)
        self.done[operation.__name__] += 1


def update_line_quantity(w: ChildWorkload) -> None:
    order_id, line_no = w.rng.choice(w.lines)
    w.conn.execute(
        "UPDATE shop.order_lines SET quantity = %s WHERE order_id = %s AND line_no = %s",
        (w.rng.randint(1, 20), order_id, line_no),
    )


def insert_line(w: ChildWorkload) -> None:
    order_id = w.rng.choice(w.line_orders)
    line_no = w.next_line[order_id]
    w.next_line[order_id] += 1
    w.conn.execute(
        "INSERT INTO shop.order_lines (order_id, line_no, product_id, quantity, unit_price) "
        "VALUES (%s, %s, %s, %s, %s)",
        (order_id, line_no, w.rng.randint(1, w.products), w.rng.randint(1, 9),
         Decimal(w.rng.randint(100, 99999)) / 100),
    )  # fmt: skip
    w.lines.append((order_id, line_no))


def delete_line(w: ChildWorkload) -> None:
    index = w.rng.randrange(len(w.lines))
    w.lines[index], w.lines[-1] = w.lines[-1], w.lines[index]
    order_id, line_no = w.lines.pop()
    w.conn.execute(
        "DELETE FROM shop.order_lines WHERE order_id = %s AND line_no = %s", (order_id, line_no)
    )


def reprice_product(w: ChildWorkload) -> None:
    """Leaves the TOASTed description out of the change, as MixedWorkload's price updates."""
    w.conn.execute(
        "UPDATE shop.products SET price = %s, updated_at = now() WHERE id = %s",
        (Decimal(w.rng.randint(100, 99999)) / 100, w.rng.choice(w.product_ids)),
    )


def rename_product(w: ChildWorkload) -> None:
    product_id = w.rng.choice(w.product_ids)
    w.conn.execute(
        "UPDATE shop.products SET name = %s, updated_at = now() WHERE id = %s",
        (f"Product {product_id} v{w.rng.randrange(10**9)}", product_id),
    )


def rename_customer(w: ChildWorkload) -> None:
    w.conn.execute(
        "UPDATE shop.customers SET full_name = %s, updated_at = now() WHERE id = %s",
        (f"Renamed {w.rng.randrange(10**9)}", w.rng.choice(w.customer_ids)),
    )


# As many lines inserted as deleted (the documents keep their size). A product is in ~30
# orders' lines and a customer has ~10 orders at the defaults: those changes fan out.
CHILD_OPERATIONS: list[Callable[[ChildWorkload], None]] = [
    update_line_quantity,
    insert_line,
    delete_line,
    reprice_product,
    rename_product,
    rename_customer,
]
CHILD_WEIGHTS = [40, 15, 15, 10, 5, 15]
