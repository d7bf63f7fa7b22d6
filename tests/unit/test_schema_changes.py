"""The on_schema_change policy: evolve adds and widens, ignore keeps, fail names the setting."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cdc_sync.job.schema_changes import SchemaChangeRejected, SchemaTracker
from cdc_sync.mapping import OnSchemaChange, Policies, TableRoute, load_mapping
from cdc_sync.schema import Column, ColumnType, RowSchema, TypeKind

pytestmark = pytest.mark.unit
MAPPING = load_mapping(Path("mappings/shop.yaml"))
ROUTE = next(iter(MAPPING.tables.values()))


def route(policy: OnSchemaChange) -> TableRoute:
    return dataclasses.replace(ROUTE, policies=Policies(on_schema_change=policy))


def schema(**columns: TypeKind) -> RowSchema:
    return RowSchema(tuple(Column(name, ColumnType(kind)) for name, kind in columns.items()))


BASE = schema(id=TypeKind.INT32, name=TypeKind.STRING)


def tracker_seeing(policy: OnSchemaChange) -> tuple[SchemaTracker, TableRoute]:
    tracker, table_route = SchemaTracker(MAPPING), route(policy)
    first = tracker.observe(table_route, BASE)
    assert first.evolved and first.schema == BASE
    assert not tracker.observe(table_route, BASE).evolved  # same schema: nothing to do
    return tracker, table_route


def test_evolve_adds_columns_and_keeps_dropped_ones() -> None:
    tracker, table_route = tracker_seeing(OnSchemaChange.EVOLVE)
    state = tracker.observe(table_route, schema(id=TypeKind.INT32, nick=TypeKind.STRING))
    assert state.evolved
    assert state.schema.names == ("id", "nick", "name")  # `name` dropped at the source: kept


def test_evolve_widens_but_rejects_narrowing_naming_column_and_setting() -> None:
    tracker, table_route = tracker_seeing(OnSchemaChange.EVOLVE)
    wide = tracker.observe(table_route, schema(id=TypeKind.INT64, name=TypeKind.STRING))
    assert wide.evolved and wide.schema.column("id").type.kind is TypeKind.INT64
    with pytest.raises(SchemaChangeRejected) as error:
        tracker.observe(table_route, schema(id=TypeKind.INT16, name=TypeKind.STRING))
    message = str(error.value)
    assert str(ROUTE.table) in message and "'id'" in message
    assert "on_schema_change" in message and str(MAPPING.path) in message


def test_incompatible_type_change_is_rejected_under_evolve() -> None:
    tracker, table_route = tracker_seeing(OnSchemaChange.EVOLVE)
    with pytest.raises(SchemaChangeRejected, match="type changed"):
        tracker.observe(table_route, schema(id=TypeKind.STRING, name=TypeKind.STRING))


def test_fail_rejects_an_added_column() -> None:
    tracker, table_route = tracker_seeing(OnSchemaChange.FAIL)
    with pytest.raises(SchemaChangeRejected, match=r"added \['nick'\].*on_schema_change"):
        tracker.observe(
            table_route, schema(id=TypeKind.INT32, name=TypeKind.STRING, nick=TypeKind.STRING)
        )


def test_ignore_keeps_the_first_schema_and_its_columns_only() -> None:
    tracker, table_route = tracker_seeing(OnSchemaChange.IGNORE)
    state = tracker.observe(
        table_route, schema(id=TypeKind.INT64, name=TypeKind.STRING, nick=TypeKind.STRING)
    )
    assert not state.evolved and state.schema == BASE
    assert state.allowed_columns == {"id", "name"}


@pytest.mark.parametrize("policy", list(OnSchemaChange))
def test_a_new_wire_encoding_of_the_same_stored_type_is_no_schema_change(
    policy: OnSchemaChange,
) -> None:
    # interval.handling.mode numeric -> string: MicroDuration and Interval both store int64 µs.
    tracker, table_route = SchemaTracker(MAPPING), route(policy)
    numeric = RowSchema((*BASE.columns, Column("took", ColumnType(TypeKind.INT64))))
    iso = RowSchema((*BASE.columns, Column("took", ColumnType(TypeKind.INT64, unit="iso8601"))))
    assert tracker.observe(table_route, numeric).evolved
    state = tracker.observe(table_route, iso)
    assert not state.evolved and state.schema == iso and state.allowed_columns is None
