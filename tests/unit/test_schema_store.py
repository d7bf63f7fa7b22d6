"""The accepted-schema store: exact JSON round trip, atomic files, corrupt files named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdc_sync.core.model import TableId
from cdc_sync.core.types import (
    Column,
    ColumnType,
    RowSchema,
    TypeKind,
    row_schema_from_json,
    row_schema_to_json,
)
from cdc_sync.job.settle.schema_store import FileSchemaStore, SchemaStateCorrupt

pytestmark = pytest.mark.unit
TABLE = TableId("shop", "customers")

EVERY_TYPE = RowSchema(
    (
        *(Column(f"c_{kind.value}", ColumnType(kind)) for kind in TypeKind),
        Column("required", ColumnType(TypeKind.INT64, optional=False)),
        Column("money", ColumnType(TypeKind.DECIMAL, precision=10, scale=2)),
        Column("variable", ColumnType(TypeKind.DECIMAL, scale=0)),
        Column("at", ColumnType(TypeKind.TIMESTAMP_TZ, unit="us")),
        Column("clock", ColumnType(TypeKind.TIME, optional=False, unit="ns")),
        Column(
            "grid",
            ColumnType(
                TypeKind.ARRAY,
                element=ColumnType(
                    TypeKind.ARRAY, element=ColumnType(TypeKind.DECIMAL, False, 5, 1)
                ),
            ),
        ),
        Column('名前 "quoted"', ColumnType(TypeKind.STRING)),
    )
)


def test_row_schema_round_trips_exactly_through_json() -> None:
    text = json.dumps(row_schema_to_json(EVERY_TYPE))
    back = row_schema_from_json(json.loads(text))
    assert back == EVERY_TYPE
    assert back.fingerprint == EVERY_TYPE.fingerprint


@pytest.mark.parametrize(
    "bad",
    [
        {"columns": 1},
        [{"name": "a"}],
        [{"name": "a", "type": {"kind": "nope"}}],
        [{"name": 1, "type": dict.fromkeys(["kind", "optional"])}],
    ],
)
def test_malformed_json_is_rejected(bad: object) -> None:
    with pytest.raises(ValueError):
        row_schema_from_json(bad)


def test_int_fields_refuse_booleans() -> None:
    [column] = row_schema_to_json(
        RowSchema((Column("m", ColumnType(TypeKind.DECIMAL, True, 5, 2)),))
    )
    column["type"]["precision"] = True
    with pytest.raises(ValueError, match="precision"):
        row_schema_from_json([column])


def test_store_saves_and_loads_per_table(tmp_path: Path) -> None:
    store = FileSchemaStore.beside_checkpoint(tmp_path)
    assert store.load(TABLE) is None
    store.save(TABLE, EVERY_TYPE)
    other = TableId("shop", "orders")
    store.save(other, RowSchema(()))
    assert store.path(TABLE) == tmp_path / "cdc_sync_schemas" / "shop.customers.json"
    assert FileSchemaStore.beside_checkpoint(tmp_path).load(TABLE) == EVERY_TYPE
    assert store.load(other) == RowSchema(())
    # Replaced by rename: no temp files left behind.
    assert sorted(p.name for p in store.root.iterdir()) == [
        "shop.customers.json",
        "shop.orders.json",
    ]


def test_table_names_with_dots_and_slashes_get_distinct_files(tmp_path: Path) -> None:
    store = FileSchemaStore(tmp_path)
    one, two = TableId("a.b", "c"), TableId("a", "b.c")
    assert store.path(one) != store.path(two)
    assert store.path(TableId("x/y", "..")).parent == tmp_path


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "",
        json.dumps({"format": 1, "table": "shop.other", "fingerprint": "", "columns": []}),
        json.dumps({"format": 1, "table": "shop.customers", "fingerprint": "x", "columns": []}),
        json.dumps({"format": 1, "table": "shop.customers"}),
    ],
)
def test_corrupt_file_fails_naming_it(tmp_path: Path, content: str) -> None:
    store = FileSchemaStore(tmp_path)
    store.path(TABLE).write_text(content)
    with pytest.raises(SchemaStateCorrupt) as error:
        store.load(TABLE)
    assert str(store.path(TABLE)) in str(error.value) and str(TABLE) in str(error.value)
