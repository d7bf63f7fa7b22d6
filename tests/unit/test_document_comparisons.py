"""Document rows join and arrays sort as Postgres compares the columns' types (the job's
document step, on its state, without services): numbers by value across integer and numeric
kinds and scales, whatever the decimal mode's JSON; arrays in numeric order, nulls last.
Against Postgres itself: tests/integration/test_document_comparisons.py."""

from __future__ import annotations

import dataclasses
import textwrap
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from cdc_sync.core.model import Change, Coordinates, Op, TableId
from cdc_sync.core.types import Column, ColumnType, RowSchema, TypeKind
from cdc_sync.documents.comparisons import schema_types
from cdc_sync.documents.sync import DocumentSync
from cdc_sync.mapping import load_mapping
from tests.unit.test_documents import MemoryIndex

pytestmark = pytest.mark.unit

MAPPING = """
version: 1
source: {topic_prefix: t}
documents:
  orders:
    root: s.orders
    relations:
      tier: {table: s.tiers, kind: one, join: {tier: id}}
      parts: {table: s.parts, join: {id: order_id}}
      lines: {table: s.lines, join: {id: order_id}, order_by: [price]}
      notes: {table: s.notes, join: {id: order_id}}
"""
INT4 = ColumnType(TypeKind.INT32)
NUMERIC = ColumnType(TypeKind.DECIMAL)  # no typmod: variable scale
SCHEMAS = {
    TableId("s", "orders"): RowSchema((Column("id", INT4), Column("tier", NUMERIC))),
    TableId("s", "tiers"): RowSchema(
        (Column("id", ColumnType(TypeKind.DECIMAL, precision=10, scale=0)),)
    ),
    TableId("s", "parts"): RowSchema(
        (Column("order_id", ColumnType(TypeKind.DECIMAL, precision=12, scale=2)),)
    ),
    TableId("s", "lines"): RowSchema(
        (
            Column("order_id", INT4),
            Column("line_no", INT4),
            Column("price", ColumnType(TypeKind.DECIMAL, precision=10, scale=2)),
        )
    ),
    TableId("s", "notes"): RowSchema((Column("order_id", INT4), Column("id", NUMERIC))),
}
KEYS = {
    "orders": ("id",),
    "tiers": ("id",),
    "parts": ("order_id",),
    "lines": ("order_id", "line_no"),
    "notes": ("id",),
}


def change(table: str, row: dict[str, Any], version: int = 10) -> Change:
    return Change(
        TableId("s", table),
        tuple((k, row[k]) for k in KEYS[table]),
        Op.CREATE,
        version,
        row,
        Coordinates(f"t.s.{table}", 0, version),
        schema=SCHEMAS[TableId("s", table)],
    )


def synced(tmp_path: Path, *changes: Change) -> dict[str, dict[str, Any]]:
    path = tmp_path / "m.yaml"
    path.write_text(textwrap.dedent(MAPPING))
    index = MemoryIndex()
    sync = DocumentSync(load_mapping(path), tmp_path / "state.sqlite", index)
    # The types as the catalog gives them: each column's (here: as its kind says) and the key.
    types = {
        table: dataclasses.replace(found, key=KEYS[table.table])
        for table, found in schema_types(SCHEMAS).items()
    }
    sync.ensure_targets(SCHEMAS, types)
    by_table: dict[TableId, list[Change]] = {}
    for found in changes:
        by_table.setdefault(found.table, []).append(found)
    sync.apply([], by_table)
    sync.close()
    return index.docs


def test_numbers_join_by_value_across_kinds_and_scales(tmp_path: Path) -> None:
    """int4 1 = numeric(12,2) 1.00 (JSON 1 and "1.00"); numeric 5.0 = numeric(10,0) 5."""
    docs = synced(
        tmp_path,
        change("orders", {"id": 1, "tier": Decimal("5.0")}),
        change("tiers", {"id": Decimal("5")}),
        change("parts", {"order_id": Decimal("1.00")}),
    )
    assert docs["1"]["tier"] == {"id": "5"}
    assert docs["1"]["parts"] == [{"order_id": "1.00"}]


def test_arrays_sort_numbers_by_value_and_nulls_last(tmp_path: Path) -> None:
    """`order_by` a numeric column (its JSON is text: "-10.00" < "-2.00" as text), and the
    default order, by a numeric key: both by value, nulls last as Postgres's ASC."""
    prices = ["10.00", "-2.00", None, "9.50", "-10.00"]
    keys = ["10", "-2.5", "9.75", "100", "-10"]
    docs = synced(
        tmp_path,
        change("orders", {"id": 1, "tier": None}),
        *(
            change("lines", {"order_id": 1, "line_no": n, "price": p and Decimal(p)})
            for n, p in enumerate(prices)
        ),
        *(change("notes", {"order_id": 1, "id": Decimal(k)}) for k in keys),
    )
    assert [line["price"] for line in docs["1"]["lines"]] == [
        "-10.00",
        "-2.00",
        "9.50",
        "10.00",
        None,
    ]
    assert [note["id"] for note in docs["1"]["notes"]] == ["-10", "-2.5", "9.75", "10", "100"]
