"""TRUNCATE: decoded as its own event, carried to the driver, fencing older changes, applied by
every sink as pure actions (no services)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest

from cdc_sync.core.model import (
    UNVERSIONED,
    Change,
    Op,
    TableId,
    Truncate,
    TruncateFence,
)
from cdc_sync.core.types import KnownSchema
from cdc_sync.debezium.decoder import MalformedRecord, parse_record
from cdc_sync.job.decode.partition import (
    KIND_CHANGE,
    KIND_STATS,
    KIND_TRUNCATE,
    decode_and_fold,
)
from cdc_sync.job.settle.applier import BatchApplier
from cdc_sync.job.settle.truncates import (
    FileTruncateFences,
    TruncateFences,
    TruncateFencesCorrupt,
    newest_per_table,
)
from cdc_sync.job.stream import SideRows
from cdc_sync.mapping import (
    CacheRoute,
    DeltaRoute,
    OnSnapshotEnd,
    Policies,
    SearchRoute,
    TableRoute,
)
from cdc_sync.schema import Column, ColumnType, RowSchema, TypeKind
from cdc_sync.shape.spec import OnDelete, SinkShape
from cdc_sync.sinks.base import WriteResult
from cdc_sync.sinks.delta.actions import marks_predicate, snapshot_end_marks, truncate_predicate
from cdc_sync.sinks.redis.actions import truncate_actions as cache_truncate
from cdc_sync.sinks.redis.actions import version_string
from cdc_sync.sinks.search.actions import truncate_actions as search_truncate
from tests.changes import change as change_of
from tests.changes import mapping_of, products_route
from tests.envelopes import coords, envelope_bytes, key_bytes, product, truncate_bytes

pytestmark = pytest.mark.unit
PRODUCTS = TableId("shop", "products")


def change(version: int, position: int | None = None, op: Op = Op.UPDATE) -> Change:
    row = None if op is Op.DELETE else {"id": 1}
    return Change(PRODUCTS, (("id", 1),), op, version, row, coords(0), position=position)


def truncate(version: int, position: int | None = None, offset: int = 0) -> Truncate:
    return Truncate(PRODUCTS, version, coords(offset), position)


# --- decode -------------------------------------------------------------------------------


def test_a_keyless_op_t_record_is_the_tables_truncate_versioned_by_its_last_commit() -> None:
    parsed = parse_record(None, truncate_bytes("products", 5000, 5100), coords(7))
    assert parsed == Truncate(PRODUCTS, 5000, coords(7), 5100, 1_700_000_000_000)
    assert parsed.fence == TruncateFence(5000, 5100)
    assert parsed.commit_bound == 5100


def test_the_first_truncate_after_a_snapshot_takes_the_snapshot_floor() -> None:
    """`[null, lsn]`: the same rule as every streamed change (commit_order_version)."""
    parsed = parse_record(None, truncate_bytes("products", None, 90), coords(1), floor=120)
    assert isinstance(parsed, Truncate) and parsed.version == 120 and parsed.position == 90


def test_a_truncate_keyed_on_the_way_is_a_truncate_all_the_same() -> None:
    key = key_bytes("products", {"id": 1})
    parsed = parse_record(key, truncate_bytes("products", 5000, 5100), coords(1))
    assert isinstance(parsed, Truncate) and parsed.table == PRODUCTS


def test_a_schemaless_truncate_parses_with_catalog_schemas() -> None:
    id_column = Column("id", ColumnType(TypeKind.INT32, optional=False))
    known = {PRODUCTS: KnownSchema(key=RowSchema((id_column,)), row=RowSchema((id_column,)))}
    payload = json.loads(truncate_bytes("products", 5000, 5100))["payload"]
    parsed = parse_record(None, json.dumps(payload).encode(), coords(3), known)
    assert isinstance(parsed, Truncate) and parsed.version == 5000


def test_other_keyless_records_stay_malformed_naming_the_key() -> None:
    with pytest.raises(MalformedRecord, match="no key"):
        parse_record(None, envelope_bytes("products", "c", 10, product(1)), coords(1))
    bad = json.loads(truncate_bytes("products", 5000, 5100))
    del bad["payload"]["source"]["sequence"], bad["payload"]["source"]["lsn"]
    with pytest.raises(MalformedRecord, match="sequence"):
        parse_record(None, json.dumps(bad).encode(), coords(1))


def test_decode_hands_the_truncate_to_the_driver_as_a_side_row() -> None:
    key = key_bytes("products", {"id": 1})
    batch = pa.RecordBatch.from_pydict(
        {
            "key": [key, None, key],
            "value": [
                envelope_bytes("products", "c", 4000, product(1)),
                truncate_bytes("products", 5000, 5100),
                envelope_bytes("products", "c", 6000, product(1, name="after")),
            ],
            "topic": ["cdc.shop.products"] * 3,
            "partition": [0] * 3,
            "offset": [0, 1, 2],
        }
    )
    rows = [r for out in decode_and_fold(iter([batch])) for r in out.to_pylist()]
    stats = {r["counted"]: r["count"] for r in rows if r["kind"] == KIND_STATS}
    assert stats == {KIND_CHANGE: 2, KIND_TRUNCATE: 1}
    side = SideRows([r for r in rows if r["kind"] != KIND_CHANGE])
    # ... with its commit time (a history closes rows at it; a soft-delete sink marks with it)
    assert side.truncates == [Truncate(PRODUCTS, 5000, coords(1), 5100, 1_700_000_000_000)]
    assert side.rejected == [] and side.commit_bound == 6000


# --- the fence ----------------------------------------------------------------------------


def test_the_fence_covers_older_transactions_and_its_own_before_the_statement() -> None:
    fence = TruncateFence(5000, 5100)
    assert fence.covers(change(4999, 4999))
    assert fence.covers(change(5000, 5050))  # its own transaction, before the TRUNCATE
    assert not fence.covers(change(5000, 5200))  # its own transaction after it: a reload
    assert not fence.covers(change(5000, None))  # no position: kept
    assert not fence.covers(change(5001, 5001))
    unversioned = change(UNVERSIONED, op=Op.DELETE)
    assert not fence.covers(unversioned)  # a tombstone only removes


def test_the_newest_truncate_of_each_table_wins() -> None:
    other = TableId("shop", "orders")
    newest = newest_per_table(
        [truncate(10, 11), truncate(30, 31), truncate(20, 21), Truncate(other, 5, coords(0), 6)]
    )
    assert {t: n.version for t, n in newest.items()} == {PRODUCTS: 30, other: 5}


class TruncatingSink:
    def __init__(self, name: str) -> None:
        self.name = name
        self.truncated: list[tuple[TableId, int]] = []

    def truncate(self, route: TableRoute, truncate: Truncate) -> int:
        self.truncated.append((route.table, truncate.version))
        return 2


def routes() -> TableRoute:
    return TableRoute(
        PRODUCTS,
        None,
        {},
        SearchRoute("products"),
        CacheRoute("cache"),
        DeltaRoute("shop", "products"),
        Policies(),
    )


class OneTable:
    """The part of a mapping the fences use."""

    def route_for(self, table: TableId) -> TableRoute | None:
        return routes() if table == PRODUCTS else None

    def policies_for(self, table: TableId) -> Policies:
        return Policies()


def test_fences_apply_each_tables_newest_truncate_to_every_sink_and_survive_restarts(
    tmp_path: Path,
) -> None:
    store = FileTruncateFences.beside_checkpoint(tmp_path)
    fences = TruncateFences(store)
    sinks = [TruncatingSink("search"), TruncatingSink("delta")]
    unrouted = Truncate(TableId("shop", "cdc_sync_heartbeat"), 99, coords(0), 99)
    removed = fences.apply(
        OneTable(),  # type: ignore[arg-type]
        sinks,  # type: ignore[arg-type]
        [truncate(10, 11), truncate(30, 31), unrouted],
    )
    assert removed == {"search": 2, "delta": 2}
    assert all(s.truncated == [(PRODUCTS, 30)] for s in sinks)
    assert TruncateFences(store).fences == {PRODUCTS: TruncateFence(30, 31)}
    # An older truncate (a replay) is applied again, harmlessly, and never lowers the fence.
    fences.apply(OneTable(), sinks, [truncate(10, 11)])  # type: ignore[arg-type]
    assert TruncateFences(store).fences == {PRODUCTS: TruncateFence(30, 31)}


def test_an_unreadable_fences_file_is_refused_naming_it(tmp_path: Path) -> None:
    store = FileTruncateFences.beside_checkpoint(tmp_path)
    store.path.write_text("{not json")
    with pytest.raises(TruncateFencesCorrupt, match="cdc_sync_truncates"):
        store.load()


# --- each sink's pure actions -------------------------------------------------------------

STORED = {"1": 4000, "2": 4999, "3": 5000, "4": 7000}  # doc id -> version a sink holds


def test_search_deletes_the_older_documents_just_below_the_truncate() -> None:
    actions = search_truncate(routes(), truncate(5000, 5100), STORED)
    assert actions is not None and actions.alias == "products"
    assert [(a.op, a.doc_id, a.version) for a in actions.actions] == [
        ("delete", "1", 4999),
        ("delete", "2", 4999),
    ]
    # external_gte at 4999: applies where the index holds <= 4999, a newer write answers 409.
    assert actions.actions[0].header("products_v1")["delete"]["version_type"] == "external_gte"


def test_cache_deletes_the_older_rows_through_the_fenced_script() -> None:
    actions = cache_truncate(routes(), truncate(5000, 5100), STORED)
    assert [(a.op, a.key, a.version) for a in actions] == [
        ("delete", "cache:shop.products:1", version_string(4999)),
        ("delete", "cache:shop.products:2", version_string(4999)),
    ]
    assert actions[0].tombstone_key == "cache:_tombstone:shop.products:1"


def test_delta_deletes_by_version() -> None:
    assert truncate_predicate(5000) == "_cdc_version < 5000"


def test_a_snapshot_end_marks_in_a_soft_delete_sink_and_a_truncate_still_deletes() -> None:
    """`on_delete: soft`: the rows a full snapshot no longer holds stay, marked at its time
    just below its version, written over the stored row (`Change.marks_deleted`); rows
    marked already keep their mark. A TRUNCATE statement deletes as in every sink."""
    soft = SinkShape("search", "m.yaml: tables.shop.products", on_delete=OnDelete.SOFT)
    route = replace(routes(), shapes={"search": soft, "cache": replace(soft, sink="cache")})
    end = Truncate(PRODUCTS, 5000, coords(0), None, 1_800_000_000_000, snapshot_end=True)
    actions = search_truncate(route, end, STORED, marked={"2"})
    assert actions is not None
    assert [(a.op, a.doc_id, a.version, a.mark) for a in actions.actions] == [
        ("index", "1", 4999, True)
    ]
    marks = {"_deleted": True, "_deleted_at": "2027-01-15T08:00:00+00:00"}
    assert actions.actions[0].document == marks
    (mark,) = cache_truncate(route, end, STORED, marked={"2"})
    assert (mark.op, mark.key, mark.version) == ("mark", "cache:shop.products:1", "0" * 16 + "4999")
    statement = replace(end, snapshot_end=False)
    deletes = search_truncate(route, statement, STORED)
    assert deletes is not None and {a.op for a in deletes.actions} == {"delete"}
    assert {a.op for a in cache_truncate(route, statement, STORED)} == {"delete"}
    delta = replace(soft, sink="delta")
    assert snapshot_end_marks(delta, end) == {
        "_cdc_is_deleted": True,
        "_cdc_deleted_at": datetime(2027, 1, 15, 8, tzinfo=UTC),
        "_cdc_version": 4999,
        "_cdc_source_ts": datetime(2027, 1, 15, 8, tzinfo=UTC),
        "_cdc_op": "u",
    }
    assert marks_predicate(5000, '"_cdc_is_deleted"') == (
        '_cdc_version < 5000 AND NOT coalesce("_cdc_is_deleted", false)'
    )


def test_a_table_a_sink_does_not_serve_has_nothing_to_remove() -> None:
    route = routes()
    assert search_truncate(replace(route, search=None), truncate(5000), STORED) is None
    assert cache_truncate(replace(route, cache=None), truncate(5000), STORED) == []


# --- the batch: truncate first, older changes dropped, later batches fenced ---------------


class EventSink:
    """Records what the applier asks, in order."""

    name = "search"

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def ensure_target(self, route: TableRoute, schema: RowSchema | None) -> None:
        return None

    def truncate(self, route: TableRoute, truncate: Truncate) -> int:
        self.events.append(("truncate", truncate.version))
        return 0

    def apply(self, route: TableRoute, changes: Sequence[Change]) -> WriteResult:
        self.events.append(("apply", sorted((c.doc_id, c.version) for c in changes)))
        return WriteResult(applied=len(changes))

    def record_watermark(self, routes: Mapping[str, TableRoute], position: int) -> None:
        return None

    def close(self) -> None:
        return None


def test_a_batch_truncates_before_its_writes_and_drops_what_the_truncate_removed(
    tmp_path: Path,
) -> None:
    route = products_route()
    sink = EventSink()
    store = FileTruncateFences.beside_checkpoint(tmp_path)
    applier = BatchApplier(mapping_of(route), [sink], None, truncates=TruncateFences(store))
    row = {"id": 1, "sku": "s", "name": "n", "description": None, "price": None, "in_stock": True}
    before = change_of(route, "c", 4000, 1, row)  # written before the TRUNCATE
    after = change_of(route, "c", 6000, 2, row | {"id": 2})  # after it
    metrics = applier.apply(
        1,
        records=3,
        changes=2,
        compacted=[before, after],
        rejected=[],
        schemas={},
        schema_fps=[None, None],
        truncates=[Truncate(PRODUCTS, 5000, coords(1), 5100)],
    )
    assert sink.events == [("truncate", 5000), ("apply", [("2", 6000)])]
    assert (metrics.truncates, metrics.truncated) == (1, 1) and metrics.reconciles()
    assert metrics.commit_bound == 6000

    # After a restart: a stale change older than the truncate (a replay, a transaction sent
    # again) is still dropped; a newer one applies.
    sink.events.clear()
    restarted = BatchApplier(mapping_of(route), [sink], None, truncates=TruncateFences(store))
    newer = change_of(route, "u", 7000, 1, row)
    restarted.apply(
        2,
        records=2,
        changes=2,
        compacted=[dataclasses.replace(before, coordinates=coords(9)), newer],
        rejected=[],
        schemas={},
        schema_fps=[None, None],
    )
    assert sink.events == [("apply", [("1", 7000)])]


# --- the end of a table's full snapshot ---------------------------------------------------


def snapshot_row(id_: int, point: int, marker: str) -> bytes:
    """A snapshot row as Debezium writes it: op `r`, `[null, point]`, the snapshot marker."""
    record = json.loads(envelope_bytes("products", "r", point, product(id_)))
    source = record["payload"]["source"]
    source["snapshot"] = marker
    source["sequence"] = json.dumps([None, point])
    return json.dumps(record).encode()


def snapshot_batch(markers: Sequence[str], point: int = 9000) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "key": [key_bytes("products", {"id": i}) for i in range(len(markers))],
            "value": [snapshot_row(i, point, m) for i, m in enumerate(markers)],
            "topic": ["cdc.shop.products"] * len(markers),
            "partition": [0] * len(markers),
            "offset": list(range(len(markers))),
        }
    )


@pytest.mark.parametrize("marker", ["last_in_data_collection", "last"])
def test_the_last_row_of_a_tables_snapshot_also_ends_the_snapshot(marker: str) -> None:
    rows = [
        r
        for out in decode_and_fold(iter([snapshot_batch(["first", "true", marker])]))
        for r in out.to_pylist()
    ]
    stats = {r["counted"]: r["count"] for r in rows if r["kind"] == KIND_STATS}
    assert stats == {KIND_CHANGE: 3}  # the row is a change; its end is no record of its own
    assert sum(1 for r in rows if r["kind"] == KIND_CHANGE) == 3
    side = SideRows([r for r in rows if r["kind"] != KIND_CHANGE])
    assert side.truncates == [
        Truncate(PRODUCTS, 9000, coords(2), None, 1_700_000_000_000, snapshot_end=True)
    ]
    assert side.truncates[0].fence == TruncateFence(9000, -1)  # its own rows are not covered
    assert not side.truncates[0].fence.covers(change(9000))


@pytest.mark.parametrize("markers", [["first", "true"], ["incremental", "incremental"]])
def test_rows_that_do_not_end_a_full_snapshot_end_nothing(markers: list[str]) -> None:
    rows = [r for out in decode_and_fold(iter([snapshot_batch(markers)])) for r in out.to_pylist()]
    assert SideRows([r for r in rows if r["kind"] != KIND_CHANGE]).truncates == []


class PolicyTable(OneTable):
    def __init__(self, policies: Policies) -> None:
        self.policies = policies

    def route_for(self, table: TableId) -> TableRoute | None:
        route = super().route_for(table)
        return None if route is None else dataclasses.replace(route, policies=self.policies)

    def policies_for(self, table: TableId) -> Policies:
        return self.policies


def test_a_snapshot_end_removes_older_rows_unless_the_table_keeps_them() -> None:
    ended = Truncate(PRODUCTS, 9000, coords(5), None, snapshot_end=True)
    sinks = [TruncatingSink("search")]
    swept = TruncateFences()
    swept.apply(PolicyTable(Policies()), sinks, [ended])  # type: ignore[arg-type]
    assert sinks[0].truncated == [(PRODUCTS, 9000)]
    assert swept.fences == {PRODUCTS: TruncateFence(9000, -1)}
    kept = TruncateFences()
    sinks = [TruncatingSink("search")]
    keep = PolicyTable(Policies(on_snapshot_end=OnSnapshotEnd.KEEP))
    # A real TRUNCATE in the same batch still applies when the snapshot's end is kept.
    kept.apply(keep, sinks, [truncate(100, 101), ended])  # type: ignore[arg-type]
    assert sinks[0].truncated == [(PRODUCTS, 100)]
    assert kept.fences == {PRODUCTS: TruncateFence(100, 101)}


def test_a_snapshot_end_sweeps_before_the_batchs_writes_and_is_no_record_of_its_own() -> None:
    route = products_route()
    sink = EventSink()
    applier = BatchApplier(mapping_of(route), [sink], None)
    row = {"id": 1, "sku": "s", "name": "n", "description": None, "price": None, "in_stock": True}
    last = change_of(route, "r", 9000, 1, row)  # the table's last snapshot row
    metrics = applier.apply(
        1,
        records=1,
        changes=1,
        compacted=[last],
        rejected=[],
        schemas={},
        schema_fps=[None],
        truncates=[Truncate(PRODUCTS, 9000, coords(1), None, snapshot_end=True)],
    )
    assert sink.events == [("truncate", 9000), ("apply", [("1", 9000)])]
    assert (metrics.truncates, metrics.truncated) == (0, 0) and metrics.reconciles()
