"""Fan-out probe: one parent update that reaches N document roots, through the job's document step.

    .venv/bin/python benchmarks/probe_document_fanout.py [--roots 10000] [--lines 3]

Builds the documents' state (`cdc_sync.documents`, a SQLite file in a temporary directory) for
the demo's `shop_order_documents` spec: one customer with N orders of L lines each, over a few
products. Then applies one batch holding a single change, the customer's rename, and times the
step: the fan-out (which roots it touches), rendering them in chunks and handing each chunk to
the writer. The writer here only counts and sizes what it is given, so the figures are the
step's own cost, without a search server (`make bench-documents` measures the whole pipeline).
Prints seconds, documents/s, the Python heap's peak during the step (tracemalloc) and the
state file's size, and checks that every root was rendered with the new name.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from cdc_sync.core.model import Change, Coordinates, Op, TableId  # noqa: E402
from cdc_sync.core.types import Column, ColumnType, RowSchema, TypeKind  # noqa: E402
from cdc_sync.documents.sync import DocumentSync  # noqa: E402
from cdc_sync.mapping import TableRoute, load_mapping  # noqa: E402
from cdc_sync.sinks.base import WriteResult  # noqa: E402
from cdc_sync.sinks.search.actions import BulkAction  # noqa: E402

MAPPING = ROOT / "mappings" / "shop.yaml"
DOCUMENT = "shop_order_documents"
PRODUCTS = 50


class CountingWriter:
    """A writer that keeps nothing: counts documents and their JSON bytes."""

    def __init__(self) -> None:
        self.documents = 0
        self.bytes = 0
        self.renamed = 0

    def ensure_target(self, route: TableRoute, schema: RowSchema | None) -> None:
        pass

    def holds(self, alias: str) -> bool:
        return True

    def highest_version(self, alias: str) -> int:
        return 0

    def next_generation(self, route: TableRoute) -> str:
        raise AssertionError("no rebuild expected")

    def promote(self, alias: str, index: str) -> None:
        raise AssertionError("no rebuild expected")

    def write_documents(self, alias: str, actions: Sequence[BulkAction]) -> WriteResult:
        for action in actions:
            self.documents += 1
            self.bytes += len(json.dumps(action.document))
            customer = (action.document or {}).get("customer") or {}
            self.renamed += customer.get("full_name") == "Renamed"
        return WriteResult(applied=len(actions))


def schema(*columns: tuple[str, TypeKind]) -> RowSchema:
    return RowSchema(tuple(Column(name, ColumnType(kind)) for name, kind in columns))


INT, TEXT, NUM = TypeKind.INT64, TypeKind.STRING, TypeKind.DECIMAL
SCHEMAS = {
    "customers": schema(("id", INT), ("email", TEXT), ("full_name", TEXT), ("tier", TEXT)),
    "orders": schema(("id", INT), ("customer_id", INT), ("status", TEXT), ("total", TEXT)),
    "order_lines": schema(
        ("order_id", INT),
        ("line_no", INT),
        ("product_id", INT),
        ("quantity", INT),
        ("unit_price", TEXT),
    ),
    "products": schema(("id", INT), ("sku", TEXT), ("name", TEXT), ("price", TEXT)),
}
KEYS = {
    "customers": ("id",),
    "orders": ("id",),
    "order_lines": ("order_id", "line_no"),
    "products": ("id",),
}


def change(table: str, row: dict[str, object], version: int) -> Change:
    return Change(
        TableId("shop", table),
        tuple((k, row[k]) for k in KEYS[table]),
        Op.READ,
        version,
        row,
        Coordinates(f"cdc.shop.{table}", 0, version),
        schema=SCHEMAS[table],
    )


def load(sync: DocumentSync, roots: int, lines: int) -> None:
    """The state: one customer, `roots` orders of `lines` lines, `PRODUCTS` products."""
    customer = {"id": 1, "email": "a@x.org", "full_name": "Before", "tier": "gold"}
    batch: dict[TableId, list[Change]] = {
        TableId("shop", "customers"): [change("customers", customer, 1)],
        TableId("shop", "products"): [
            change("products", {"id": p, "sku": f"S{p}", "name": f"P{p}", "price": "1.50"}, 1)
            for p in range(1, PRODUCTS + 1)
        ],
    }
    sync.apply([], batch)
    for start in range(1, roots + 1, 1000):
        ids = range(start, min(start + 1000, roots + 1))
        orders = [
            change("orders", {"id": o, "customer_id": 1, "status": "new", "total": "9.00"}, 2)
            for o in ids
        ]
        order_lines = [
            change(
                "order_lines",
                {
                    "order_id": o,
                    "line_no": n,
                    "product_id": 1 + (o + n) % PRODUCTS,
                    "quantity": n,
                    "unit_price": "1.50",
                },
                2,
            )
            for o in ids
            for n in range(1, lines + 1)
        ]
        sync.apply(
            [], {TableId("shop", "orders"): orders, TableId("shop", "order_lines"): order_lines}
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--roots", type=int, default=10_000)
    parser.add_argument("--lines", type=int, default=3)
    args = parser.parse_args(argv)
    mapping = load_mapping(MAPPING)
    with tempfile.TemporaryDirectory() as directory:
        state = Path(directory) / "state.sqlite"
        writer = CountingWriter()
        sync = DocumentSync(mapping, state, writer)
        load(sync, args.roots, args.lines)
        loaded = writer.documents
        rename = {"id": 1, "email": "a@x.org", "full_name": "Renamed", "tier": "gold"}
        tracemalloc.start()
        started = time.perf_counter()
        sync.apply([], {TableId("shop", "customers"): [change("customers", rename, 3)]})
        took = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        rendered = writer.documents - loaded
        size = state.stat().st_size + sum(
            p.stat().st_size for p in state.parent.glob("state.sqlite-*")
        )
        sync.close()
    print(f"fan-out of one customer rename to {args.roots:,} orders ({args.lines} lines each)")
    print(f"  documents rendered      {rendered:,} (renamed: {writer.renamed:,})")
    print(f"  seconds                 {took:.2f}")
    print(f"  documents/s             {rendered / took:,.0f}")
    print(f"  peak Python heap        {peak / 2**20:.1f} MiB (tracemalloc, during the step)")
    print(f"  mean document           {writer.bytes / max(writer.documents, 1):,.0f} bytes JSON")
    print(f"  state file              {size / 2**20:.1f} MiB")
    if rendered != args.roots or writer.renamed < args.roots:
        print("  FAILED: not every root was rendered with the new name")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
