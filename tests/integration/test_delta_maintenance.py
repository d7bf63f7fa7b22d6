"""Delta upkeep on real Delta files: compaction, vacuum retention, tombstone pruning, time
travel within the retention, and Change Data Feed when the mapping turns it on."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from cdc_sync.core.errors import ConfigError
from cdc_sync.core.model import Change, TableId
from cdc_sync.mapping import DeltaRoute, Policies, TableRoute
from cdc_sync.sinks.delta import DeltaSink
from cdc_sync.sinks.delta.maintenance import UpkeepOptions, maintain_route
from cdc_sync.sinks.delta.target import CHANGE_DATA_FEED
from tests.changes import change as routed_change
from tests.envelopes import product

pytestmark = pytest.mark.integration

ROUTE = TableRoute(
    table=TableId("shop", "products"),
    columns=None,
    rename={},
    search=None,
    cache=None,
    delta=DeltaRoute("shop", "products"),
    policies=Policies(),
)
CDF_ROUTE = dataclasses.replace(ROUTE, delta=DeltaRoute("shop", "products", change_data_feed=True))


def change(route: TableRoute, op: str, lsn: int, key: int, name: str = "") -> Change:
    return routed_change(route, op, lsn, key, None if op == "d" else product(key, name=name))


def rows(table: DeltaTable) -> dict[int, str]:
    return {r["id"]: r["name"] for r in table.to_pyarrow_table(columns=["id", "name"]).to_pylist()}


def small_merges(sink: DeltaSink, route: TableRoute, batches: int) -> dict[int, str]:
    """One small MERGE per batch (as a busy job writes): inserts, updates, a delete; returns
    the rows Postgres would hold."""
    expected: dict[int, str] = {}
    for i in range(batches):
        batch = [change(route, "c", 10 * i + 1, i, f"v{i}")]
        expected[i] = f"v{i}"
        if i >= 2:
            batch.append(change(route, "u", 10 * i + 2, i - 2, f"u{i}"))
            expected[i - 2] = f"u{i}"
        sink.apply(route, batch)
    sink.apply(route, [change(route, "d", 10 * batches, 0)])
    del expected[0]
    return expected


def path_of(warehouse: Path, route: TableRoute) -> str:
    assert route.delta is not None
    return str(warehouse / route.delta.relative_path())


def test_compaction_cuts_files_keeps_rows_and_time_travel(tmp_path: Path) -> None:
    sink = DeltaSink(tmp_path, tombstone_retention_seconds=3600)
    sink.ensure_target(ROUTE, change(ROUTE, "c", 1, 1, "x").schema)
    middle = small_merges(sink, ROUTE, 6)
    table = DeltaTable(path_of(tmp_path, ROUTE))
    version_before, rows_before = table.version(), rows(table)
    assert rows_before == middle
    expected = {**middle, **{k: v for k, v in small_merges(sink, ROUTE, 12).items()}}
    assert ROUTE.delta is not None
    [data, stones] = maintain_route(tmp_path, ROUTE.delta, UpkeepOptions(3600))
    assert data.files_after < data.files_before and data.compacted > 1
    assert data.files_after == 1
    assert stones.table == "shop.products (tombstones)" and stones.tombstones_pruned == 0
    table = DeltaTable(path_of(tmp_path, ROUTE))
    assert rows(table) == expected
    # The 7-day retention kept the files older versions read: time travel still works.
    assert rows(DeltaTable(path_of(tmp_path, ROUTE), version=version_before)) == rows_before
    # The fenced MERGE still works on the compacted table.
    assert sink.apply(ROUTE, [change(ROUTE, "u", 5, 3, "stale")]).fenced == 1
    assert rows(DeltaTable(path_of(tmp_path, ROUTE)))[3] == expected[3]


def test_forced_short_retention_vacuums_what_compaction_replaced(tmp_path: Path) -> None:
    sink = DeltaSink(tmp_path, tombstone_retention_seconds=3600)
    sink.ensure_target(ROUTE, change(ROUTE, "c", 1, 1, "x").schema)
    expected = small_merges(sink, ROUTE, 8)
    assert ROUTE.delta is not None
    with pytest.raises(ConfigError, match="--retention-hours: 0 is below"):
        UpkeepOptions(3600, retention_hours=0)
    options = UpkeepOptions(3600, retention_hours=0, force=True)
    maintain_route(tmp_path, ROUTE.delta, options)
    [data, _] = maintain_route(tmp_path, ROUTE.delta, options)  # the compacted-away files go
    on_disk = [p for p in Path(path_of(tmp_path, ROUTE)).glob("*.parquet")]
    assert data.files_after == 1 and len(on_disk) == 1
    assert rows(DeltaTable(path_of(tmp_path, ROUTE))) == expected


def test_vacuum_deletes_files_whose_remove_left_the_checkpoints_but_none_in_flight(
    tmp_path: Path,
) -> None:
    """Delta drops a remove action from its checkpoints after
    `delta.deletedFileRetentionDuration` (a week; a second here), and the job writes a
    checkpoint every 100 commits: a default vacuum no longer knew those files and left them on
    disk for good. A file written but not committed yet (the job's MERGE in flight) stays."""
    sink = DeltaSink(tmp_path, tombstone_retention_seconds=3600)
    sink.ensure_target(ROUTE, change(ROUTE, "c", 1, 1, "x").schema)
    expected = small_merges(sink, ROUTE, 6)
    table_dir = Path(path_of(tmp_path, ROUTE))
    aged_out = {"delta.deletedFileRetentionDuration": "interval 1 seconds"}
    DeltaTable(str(table_dir)).alter.set_table_properties(aged_out)
    time.sleep(1.5)
    DeltaTable(str(table_dir)).create_checkpoint()
    week_ago = time.time() - 200 * 3600  # the files are as old as their removes
    for file in table_dir.glob("*.parquet"):
        os.utime(file, (week_ago, week_ago))
    in_flight = table_dir / "part-00000-in-flight.snappy.parquet"
    in_flight.write_bytes(b"written by a MERGE that has not committed yet")

    def on_disk() -> set[str]:
        return {p.name for p in table_dir.glob("*.parquet")}

    def current() -> set[str]:
        return {Path(uri).name for uri in DeltaTable(str(table_dir)).file_uris()}

    aged = on_disk() - current() - {in_flight.name}
    assert aged
    assert ROUTE.delta is not None
    maintain_route(tmp_path, ROUTE.delta, UpkeepOptions(3600))  # the week's retention
    assert not aged & on_disk() and in_flight.name in on_disk()
    # The files compaction just replaced stay for the retention; forced to 0 they go.
    maintain_route(tmp_path, ROUTE.delta, UpkeepOptions(3600, retention_hours=0, force=True))
    assert on_disk() == current() | {in_flight.name}
    assert rows(DeltaTable(str(table_dir))) == expected


def test_dry_run_changes_nothing(tmp_path: Path) -> None:
    sink = DeltaSink(tmp_path, tombstone_retention_seconds=3600)
    sink.ensure_target(ROUTE, change(ROUTE, "c", 1, 1, "x").schema)
    small_merges(sink, ROUTE, 5)
    version = DeltaTable(path_of(tmp_path, ROUTE)).version()
    assert ROUTE.delta is not None
    [data, _] = maintain_route(tmp_path, ROUTE.delta, UpkeepOptions(3600, dry_run=True))
    assert data.files_before == data.files_after and data.compacted == 0
    assert DeltaTable(path_of(tmp_path, ROUTE)).version() == version


def test_tombstones_past_their_retention_are_pruned(tmp_path: Path) -> None:
    sink = DeltaSink(tmp_path, tombstone_retention_seconds=3600)
    sink.ensure_target(ROUTE, change(ROUTE, "c", 1, 1, "x").schema)
    sink.apply(ROUTE, [change(ROUTE, "c", 10, 1, "a"), change(ROUTE, "c", 10, 2, "b")])
    sink.apply(ROUTE, [change(ROUTE, "d", 20, 1)])
    time.sleep(1.2)
    sink.apply(ROUTE, [change(ROUTE, "d", 30, 2)])
    assert ROUTE.delta is not None
    due = maintain_route(tmp_path, ROUTE.delta, UpkeepOptions(1, dry_run=True))[1]
    assert due.tombstones_pruned == 1
    [_, stones] = maintain_route(tmp_path, ROUTE.delta, UpkeepOptions(1))
    assert stones.tombstones_pruned == 1  # key 1's; key 2's is younger than a second
    # Within its retention a delete still fences a stale update of key 2.
    assert sink.apply(ROUTE, [change(ROUTE, "u", 25, 2, "stale")]).fenced == 1


def read_cdf(table: DeltaTable, start: int) -> list[dict[str, Any]]:
    return pa.table(table.load_cdf(starting_version=start).read_all()).to_pylist()


def cdf(table: DeltaTable) -> list[tuple[Any, ...]]:
    changes = read_cdf(table, 0)
    return sorted((c["id"], c["_change_type"]) for c in changes)


def test_change_data_feed_when_the_mapping_turns_it_on(tmp_path: Path) -> None:
    sink = DeltaSink(tmp_path, tombstone_retention_seconds=3600)
    sink.ensure_target(CDF_ROUTE, change(CDF_ROUTE, "c", 1, 1, "x").schema)
    table = DeltaTable(path_of(tmp_path, CDF_ROUTE))
    assert table.metadata().configuration.get(CHANGE_DATA_FEED) == "true"
    sink.apply(CDF_ROUTE, [change(CDF_ROUTE, "c", 10, 1, "a"), change(CDF_ROUTE, "c", 10, 2, "b")])
    sink.apply(CDF_ROUTE, [change(CDF_ROUTE, "u", 20, 1, "a2")])
    sink.apply(CDF_ROUTE, [change(CDF_ROUTE, "d", 30, 2)])
    assert cdf(DeltaTable(path_of(tmp_path, CDF_ROUTE))) == [
        (1, "insert"),
        (1, "update_postimage"),
        (1, "update_preimage"),
        (2, "delete"),
        (2, "insert"),
    ]


def test_change_data_feed_turned_on_later_is_set_on_the_existing_table(tmp_path: Path) -> None:
    sink = DeltaSink(tmp_path, tombstone_retention_seconds=3600)
    sink.ensure_target(ROUTE, change(ROUTE, "c", 1, 1, "x").schema)
    sink.apply(ROUTE, [change(ROUTE, "c", 10, 1, "a")])
    path = path_of(tmp_path, ROUTE)
    assert CHANGE_DATA_FEED not in DeltaTable(path).metadata().configuration
    assert CDF_ROUTE.delta is not None
    [data, _] = maintain_route(tmp_path, CDF_ROUTE.delta, UpkeepOptions(3600))
    assert data.properties_set == (CHANGE_DATA_FEED,)
    start = DeltaTable(path).version()
    sink.apply(CDF_ROUTE, [change(CDF_ROUTE, "u", 20, 1, "b")])
    changes = read_cdf(DeltaTable(path), start + 1)
    assert {(c["id"], c["_change_type"], c["name"]) for c in changes} >= {
        (1, "update_postimage", "b")
    }
