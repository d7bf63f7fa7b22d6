"""The on_schema_change policy: evolve adds and widens, ignore keeps, fail names the setting;
the accepted schema survives a restart, so a change made while the job was down meets the policy."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from cdc_sync.core.model import Change, Truncate
from cdc_sync.job.settle.applier import BatchApplier
from cdc_sync.job.settle.schema_changes import SchemaChangeRejected, SchemaTracker
from cdc_sync.job.settle.schema_store import FileSchemaStore
from cdc_sync.mapping import MappingFile, OnSchemaChange, Policies, TableRoute, load_mapping
from cdc_sync.schema import Column, ColumnType, RowSchema, TypeKind
from cdc_sync.sinks.base import WriteResult
from tests.changes import change, products_route
from tests.envelopes import PRODUCT_FIELDS, field

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
    tracker.targets_ready(table_route.table)
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


# --- restarts: the accepted schema is read back from the store beside the checkpoint ---------

ADDED = schema(id=TypeKind.INT32, name=TypeKind.STRING, nick=TypeKind.STRING)


def restarted(store_dir: Path, policy: OnSchemaChange) -> tuple[SchemaTracker, TableRoute]:
    """Tracker A accepts BASE and its targets are evolved; B is the job after a restart."""
    before = SchemaTracker(MAPPING, FileSchemaStore(store_dir))
    assert before.observe(route(policy), BASE).evolved
    before.targets_ready(ROUTE.table)
    return SchemaTracker(MAPPING, FileSchemaStore(store_dir)), route(policy)


def test_fail_after_a_restart_rejects_a_column_added_while_the_job_was_down(
    tmp_path: Path,
) -> None:
    tracker, table_route = restarted(tmp_path, OnSchemaChange.FAIL)
    with pytest.raises(SchemaChangeRejected) as error:
        tracker.observe(table_route, ADDED)
    message = str(error.value)
    assert str(ROUTE.table) in message and "added ['nick']" in message
    assert "on_schema_change" in message and str(MAPPING.path) in message
    # Nothing was accepted: the re-run after the next restart stops the same way.
    again = SchemaTracker(MAPPING, FileSchemaStore(tmp_path))
    with pytest.raises(SchemaChangeRejected, match="nick"):
        again.observe(table_route, ADDED)


def test_ignore_after_a_restart_keeps_the_column_out(tmp_path: Path) -> None:
    tracker, table_route = restarted(tmp_path, OnSchemaChange.IGNORE)
    state = tracker.observe(table_route, ADDED)
    assert state.schema == BASE and state.allowed_columns == {"id", "name"}
    assert FileSchemaStore(tmp_path).load(ROUTE.table) == BASE


def test_evolve_after_a_restart_evolves_and_saves_the_new_schema(tmp_path: Path) -> None:
    tracker, table_route = restarted(tmp_path, OnSchemaChange.EVOLVE)
    state = tracker.observe(table_route, ADDED)
    assert state.evolved and state.schema == ADDED
    assert FileSchemaStore(tmp_path).load(ROUTE.table) == ADDED


def test_targets_are_rechecked_until_confirmed_even_across_a_crash(tmp_path: Path) -> None:
    tracker = SchemaTracker(MAPPING, FileSchemaStore(tmp_path))
    table_route = route(OnSchemaChange.EVOLVE)
    tracker.observe(table_route, BASE)
    tracker.targets_ready(ROUTE.table)
    assert tracker.observe(table_route, ADDED).evolved  # saved; ensure_target then fails
    assert tracker.observe(table_route, ADDED).evolved  # the in-process re-run evolves again
    # A crash after saving: the restarted job checks the targets for the accepted schema.
    after_crash = SchemaTracker(MAPPING, FileSchemaStore(tmp_path))
    state = after_crash.observe(table_route, ADDED)
    assert state.evolved and state.schema == ADDED
    after_crash.targets_ready(ROUTE.table)
    assert not after_crash.observe(table_route, ADDED).evolved


def test_without_a_stored_schema_the_first_one_seen_is_the_baseline_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tracker = SchemaTracker(MAPPING, FileSchemaStore(tmp_path))
    with caplog.at_level(logging.INFO, logger="cdc_sync.job.settle.schema_store"):
        state = tracker.observe(route(OnSchemaChange.FAIL), ADDED)
    assert state.evolved and state.schema == ADDED
    assert "first schema seen is the baseline" in caplog.text
    assert FileSchemaStore(tmp_path).load(ROUTE.table) == ADDED


class RecordingSink:
    name = "search"

    def __init__(self) -> None:
        self.ensured: list[RowSchema | None] = []
        self.applied: list[Change] = []

    def ensure_target(self, route: TableRoute, schema: RowSchema | None) -> None:
        self.ensured.append(schema)

    def truncate(self, route: TableRoute, truncate: Truncate) -> int:
        return 0

    def apply(self, route: TableRoute, changes: Sequence[Change]) -> WriteResult:
        self.applied += changes
        return WriteResult(applied=len(changes))

    def record_watermark(self, routes: Mapping[str, TableRoute], position: int) -> None:
        return None

    def close(self) -> None:
        return None


def products_mapping(policy: OnSchemaChange) -> MappingFile:
    table_route = dataclasses.replace(products_route(), policies=Policies(on_schema_change=policy))
    return dataclasses.replace(MAPPING, tables={table_route.table: table_route})


def apply_products(
    policy: OnSchemaChange, store_dir: Path, color: bool
) -> tuple[RecordingSink, BatchApplier]:
    """One applier (one job run) over `store_dir` applying one products update."""
    mapping = products_mapping(policy)
    table_route = next(iter(mapping.tables.values()))
    sink = RecordingSink()
    applier = BatchApplier(mapping, [sink], None, schema_store=FileSchemaStore(store_dir))
    fields = [*PRODUCT_FIELDS, field("color", "string")] if color else PRODUCT_FIELDS
    row = {"id": 1, "sku": "s", "name": "n", "description": None, "price": None, "in_stock": True}
    one = change(table_route, "u", 200, 1, row | ({"color": "red"} if color else {}), fields)
    applier.apply(
        1, records=1, changes=1, compacted=[one], rejected=[], schemas={}, schema_fps=[None]
    )
    return sink, applier


def test_the_applier_keeps_the_policy_across_a_restart(tmp_path: Path) -> None:
    apply_products(OnSchemaChange.IGNORE, tmp_path, color=False)
    sink, _ = apply_products(OnSchemaChange.IGNORE, tmp_path, color=True)
    [written] = sink.applied
    assert written.row is not None and "color" not in written.row
    assert [s.names if s else None for s in sink.ensured] == [
        ("id", "sku", "name", "description", "price", "in_stock")
    ]
    with pytest.raises(SchemaChangeRejected, match=r"shop\.products.*color.*on_schema_change"):
        apply_products(OnSchemaChange.FAIL, tmp_path, color=True)


@pytest.mark.parametrize("policy", list(OnSchemaChange))
def test_a_new_wire_encoding_of_the_same_stored_type_is_no_schema_change(
    policy: OnSchemaChange,
) -> None:
    # interval.handling.mode numeric -> string: MicroDuration and Interval both store int64 µs.
    tracker, table_route = SchemaTracker(MAPPING), route(policy)
    numeric = RowSchema((*BASE.columns, Column("took", ColumnType(TypeKind.INT64))))
    iso = RowSchema((*BASE.columns, Column("took", ColumnType(TypeKind.INT64, unit="iso8601"))))
    assert tracker.observe(table_route, numeric).evolved
    tracker.targets_ready(ROUTE.table)
    state = tracker.observe(table_route, iso)
    assert not state.evolved and state.schema == iso and state.allowed_columns is None
