"""Delta sink on real Delta files, through deltalake and (when its jars are present) delta-spark."""

import dataclasses
import os
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from cdc_sync.core.model import Change, Coordinates, TableId, Truncate
from cdc_sync.job.spark_session import PACKAGES_VAR, build_spark
from cdc_sync.mapping import DeltaRoute, Policies, TableRoute
from cdc_sync.shape.spec import OnDelete, SinkShape
from cdc_sync.sinks.delta import DeltaSink
from cdc_sync.sinks.delta.handles import TableHandles
from cdc_sync.sinks.delta.spark_client import DeltaSparkWriter, delta_spark_available
from cdc_sync.sinks.delta.target import tombstone_path
from cdc_sync.sinks.delta.tombstones import COMPACT_EVERY_WRITES
from tests.changes import change as routed_change
from tests.changes import tombstone_only
from tests.envelopes import (
    PRODUCT_FIELDS,
    UNAVAILABLE,
    field,
    product,
)

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


def change(
    op: str,
    lsn: int,
    key: int,
    after: dict[str, Any] | None = None,
    fields: list[dict[str, Any]] | None = None,
) -> Change:
    return routed_change(ROUTE, op, lsn, key, after, fields)


def rows(warehouse: Path) -> dict[int, dict[str, Any]]:
    table = DeltaTable(str(warehouse / "shop" / "products")).to_pyarrow_table()
    return {r["id"]: r for r in table.to_pylist()}


def delta_spark_jars_configured() -> bool:
    """delta-spark needs its jars: from spark.jars.packages (Maven) or pyspark's jars folder."""
    import pyspark

    if "delta-spark" in os.environ.get(PACKAGES_VAR, ""):
        return True
    return any((Path(pyspark.__file__).parent / "jars").glob("delta-spark_*.jar"))


@pytest.fixture(scope="module")
def delta_spark_session() -> Iterator[Any]:
    if not delta_spark_jars_configured():
        pytest.skip(
            "delta-spark path: the io.delta:delta-spark_2.13 jars are not on Spark's classpath "
            f"(set {PACKAGES_VAR} with Maven access, or add the jars to pyspark/jars)"
        )
    shared = SparkSession.getActiveSession()  # the e2e session, when those tests ran first
    spark = build_spark("test-delta-spark")
    if not delta_spark_available(spark):
        pytest.skip("delta-spark jars configured but io.delta.tables.DeltaTable does not load")
    yield spark
    if shared is None:  # stop only a session this module started
        spark.stop()


@pytest.fixture(params=["deltalake", "delta-spark"])
def writer_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def make_sink(kind: str, warehouse: Path, request: pytest.FixtureRequest) -> DeltaSink:
    if kind == "deltalake":
        return DeltaSink(warehouse, tombstone_retention_seconds=3600)
    spark = request.getfixturevalue("delta_spark_session")
    return DeltaSink(warehouse, 3600, DeltaSparkWriter(spark, warehouse, 3600))


@pytest.fixture
def sink(writer_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> DeltaSink:
    sink = make_sink(writer_kind, tmp_path, request)
    sink.ensure_target(ROUTE, change("c", 1, 1, product(1)).schema)
    return sink


def test_newer_wins_older_is_fenced_and_reapply_is_harmless(
    sink: DeltaSink, tmp_path: Path
) -> None:
    first = sink.apply(ROUTE, [change("c", 10, 1, product(1, name="v10"))])
    assert first.applied == 1
    assert sink.apply(ROUTE, [change("u", 5, 1, product(1, name="v5"))]).fenced == 1
    assert rows(tmp_path)[1]["name"] == "v10"
    sink.apply(ROUTE, [change("u", 20, 1, product(1, name="v20"))])
    again = sink.apply(ROUTE, [change("u", 20, 1, product(1, name="v20"))])
    assert again.applied + again.fenced == 1  # an equal version rewrites the same values
    assert rows(tmp_path)[1]["name"] == "v20" and rows(tmp_path)[1]["_cdc_version"] == 20


def test_equal_versions_of_one_transaction_keep_kafka_order_across_batches(
    sink: DeltaSink, tmp_path: Path
) -> None:
    """Delete and re-insert in one transaction share its commit-order version; split over two
    micro-batches the later one (in Kafka order) must still apply."""
    sink.apply(ROUTE, [change("c", 10, 1, product(1, name="before"))])
    sink.apply(ROUTE, [change("d", 30, 1)])
    assert sink.apply(ROUTE, [change("c", 30, 1, product(1, name="again"))]).applied == 1
    assert rows(tmp_path)[1]["name"] == "again"
    sink.apply(ROUTE, [change("u", 30, 1, product(1, name="last"))])
    assert rows(tmp_path)[1]["name"] == "last"


def test_stale_update_after_delete_does_not_resurrect(sink: DeltaSink, tmp_path: Path) -> None:
    sink.apply(ROUTE, [change("c", 10, 1, product(1))])
    sink.apply(ROUTE, [change("d", 30, 1)])
    assert 1 not in rows(tmp_path)
    result = sink.apply(ROUTE, [change("u", 20, 1, product(1, name="stale"))])
    assert result.fenced == 1 and 1 not in rows(tmp_path)
    sink.apply(ROUTE, [change("c", 40, 1, product(1, name="reborn"))])
    assert rows(tmp_path)[1]["name"] == "reborn"


def test_unchanged_toast_value_keeps_the_stored_description(
    sink: DeltaSink, tmp_path: Path
) -> None:
    sink.apply(ROUTE, [change("c", 10, 1, product(1, description="long text v1"))])
    toast = change("u", 11, 1, product(1, name="renamed") | {"description": UNAVAILABLE})
    sink.apply(ROUTE, [toast, change("c", 12, 2, product(2, description="other"))])
    stored = rows(tmp_path)
    assert stored[1]["name"] == "renamed" and stored[1]["description"] == "long text v1"
    assert stored[2]["description"] == "other"


def test_added_column_evolves_the_table(sink: DeltaSink, tmp_path: Path) -> None:
    sink.apply(ROUTE, [change("c", 10, 1, product(1))])
    wider = [*PRODUCT_FIELDS, field("color", "string")]
    evolved = change("u", 11, 1, product(1) | {"color": "red"}, fields=wider)
    sink.ensure_target(ROUTE, evolved.schema)
    sink.apply(ROUTE, [evolved])
    assert rows(tmp_path)[1]["color"] == "red"


def test_delete_before_the_table_exists_still_fences_a_later_stale_insert(
    writer_kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    fresh = make_sink(writer_kind, tmp_path, request)  # no ensure_target yet
    result = fresh.apply(ROUTE, [change("d", 50, 7)])
    assert result.applied == 1 and not result.failures
    stale = change("c", 40, 7, product(7))
    fresh.ensure_target(ROUTE, stale.schema)
    assert fresh.apply(ROUTE, [stale]).fenced == 1
    assert 7 not in rows(tmp_path)


def test_widened_column_rewrites_the_table_and_keeps_rows(sink: DeltaSink, tmp_path: Path) -> None:
    narrow = [*PRODUCT_FIELDS, field("stock", "int32")]
    first = change("c", 10, 1, product(1) | {"stock": 7}, fields=narrow)
    sink.ensure_target(ROUTE, first.schema)
    sink.apply(ROUTE, [first])
    wide = [*PRODUCT_FIELDS, field("stock", "int64")]
    big = change("c", 11, 2, product(2) | {"stock": 2**40}, fields=wide)
    sink.ensure_target(ROUTE, big.schema)
    sink.apply(ROUTE, [big])
    stored = rows(tmp_path)
    assert (stored[1]["stock"], stored[2]["stock"]) == (7, 2**40)
    table = DeltaTable(str(tmp_path / "shop" / "products"))
    assert str(pa.schema(table.schema().to_arrow()).field("stock").type) == "int64"


def test_a_tombstone_without_its_delete_event_deletes_what_is_stored(
    sink: DeltaSink, tmp_path: Path
) -> None:
    sink.apply(ROUTE, [change("c", 10, 1, product(1))])
    assert sink.apply(ROUTE, [tombstone_only(ROUTE, 1)]).applied == 1
    assert 1 not in rows(tmp_path)
    assert not sink.apply(ROUTE, [tombstone_only(ROUTE, 2)]).failures  # nothing stored: done
    sink.apply(ROUTE, [change("c", 20, 1, product(1, name="later"))])
    assert rows(tmp_path)[1]["name"] == "later"


def test_the_tombstone_table_is_compacted_and_still_fences(tmp_path: Path) -> None:
    # Each batch with a delete adds a file to the tombstone table and each upsert batch reads it
    # all: without compaction a day of batches is tens of thousands of files per read.
    sink = DeltaSink(tmp_path, tombstone_retention_seconds=3600)
    sink.ensure_target(ROUTE, change("c", 1, 1, product(1)).schema)
    batches = COMPACT_EVERY_WRITES + 10
    for key in range(1, batches + 1):
        sink.apply(ROUTE, [change("c", 10 * key, key, product(key))])
        sink.apply(ROUTE, [change("d", 10 * key + 5, key)])
    assert ROUTE.delta is not None
    stones = DeltaTable(str(tombstone_path(tmp_path, ROUTE.delta)))
    assert len(stones.file_uris()) <= batches - COMPACT_EVERY_WRITES + 1
    assert stones.to_pyarrow_table().num_rows == batches
    stale = sink.apply(ROUTE, [change("u", 10 * key + 1, key, product(key)) for key in (1, 2)])
    assert stale.fenced == 2 and rows(tmp_path) == {}


def test_deletes_another_writer_records_fence_a_sink_that_keeps_its_tombstones(
    tmp_path: Path,
) -> None:
    # The sink keeps the tombstone rows it read (and its own appends) between batches: another
    # writer's delete must still fence its next batch.
    sink = DeltaSink(tmp_path, tombstone_retention_seconds=3600)
    sink.ensure_target(ROUTE, change("c", 1, 1, product(1)).schema)
    sink.apply(ROUTE, [change("c", 10, 1, product(1)), change("c", 10, 2, product(2))])
    sink.apply(ROUTE, [change("d", 20, 1)])
    assert sink.apply(ROUTE, [change("u", 15, 1, product(1))]).fenced == 1  # read and kept
    other = DeltaSink(tmp_path, tombstone_retention_seconds=3600)
    other.apply(ROUTE, [change("d", 30, 2)])
    stale = sink.apply(ROUTE, [change("u", 25, 2, product(2, name="stale"))])
    assert stale.fenced == 1 and rows(tmp_path) == {}


def test_a_tombstone_table_replaced_at_the_same_version_is_read_again(tmp_path: Path) -> None:
    # Kept rows belong to one table: a tombstone table deleted and written again up to the same
    # version number is another table (its metadata id), whose deletes fence.
    sink = DeltaSink(tmp_path, tombstone_retention_seconds=3600)
    sink.ensure_target(ROUTE, change("c", 1, 1, product(1)).schema)
    sink.apply(ROUTE, [change("d", 20, 1)])
    assert sink.apply(ROUTE, [change("u", 15, 1, product(1))]).fenced == 1  # read and kept
    assert ROUTE.delta is not None
    stones = tombstone_path(tmp_path, ROUTE.delta)
    kept_version = DeltaTable(str(stones)).version()
    shutil.rmtree(stones)
    other = DeltaSink(tmp_path, tombstone_retention_seconds=3600)
    other.apply(ROUTE, [change("d", 40, 3)])
    assert DeltaTable(str(stones)).version() == kept_version
    stale = sink.apply(ROUTE, [change("c", 35, 3, product(3, name="stale"))])
    assert stale.fenced == 1 and 3 not in rows(tmp_path)


def test_a_kept_table_handle_sees_other_writers_commits_and_a_dropped_table(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t"
    handles = TableHandles()
    assert handles.get(path) is None
    write_deltalake(str(path), pa.table({"id": [1]}))
    kept = handles.get(path)
    assert kept is not None and kept.version() == 0
    write_deltalake(str(path), pa.table({"id": [2]}), mode="append")  # another writer
    again = handles.get(path)
    assert again is kept and again.version() == 1
    assert sorted(again.to_pyarrow_table()["id"].to_pylist()) == [1, 2]
    shutil.rmtree(path)
    assert handles.get(path) is None


def test_a_key_deleted_again_is_fenced_by_its_newest_delete(tmp_path: Path) -> None:
    # Tombstones are appended: a key deleted twice has two rows, and the newer one fences.
    sink = DeltaSink(tmp_path, tombstone_retention_seconds=3600)
    sink.ensure_target(ROUTE, change("c", 1, 1, product(1)).schema)
    for op, lsn in (("c", 10), ("d", 20), ("c", 30), ("d", 40)):
        sink.apply(ROUTE, [change(op, lsn, 1, product(1) if op == "c" else None)])
    assert ROUTE.delta is not None
    stones = DeltaTable(str(tombstone_path(tmp_path, ROUTE.delta))).to_pyarrow_table()
    assert sorted(stones["_cdc_version"].to_pylist()) == [20, 40]
    stale = sink.apply(ROUTE, [change("u", 35, 1, product(1, name="stale"))])
    assert stale.fenced == 1 and rows(tmp_path) == {}
    sink.apply(ROUTE, [change("u", 45, 1, product(1, name="back"))])
    assert rows(tmp_path)[1]["name"] == "back"


def test_truncate_removes_older_rows_and_keeps_later_ones(sink: DeltaSink, tmp_path: Path) -> None:
    """Rows below the truncate's version go; a later change applied before the truncate
    arrived (a replay, another partition) and its own transaction's reload stay."""
    sink.apply(ROUTE, [change("c", 10, 1, product(1)), change("c", 20, 2, product(2))])
    sink.apply(ROUTE, [change("c", 60, 3, product(3)), change("c", 50, 4, product(4))])
    truncate = Truncate(ROUTE.table, 50, Coordinates("cdc.shop.products", 0, 9), 55)
    assert sink.truncate(ROUTE, truncate) == 2
    assert sorted(rows(tmp_path)) == [3, 4]
    assert sink.truncate(ROUTE, truncate) == 0  # a replayed truncate changes nothing


def test_truncate_of_a_table_not_created_yet_removes_nothing(
    writer_kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    sink = make_sink(writer_kind, tmp_path, request)
    truncate = Truncate(ROUTE.table, 50, Coordinates("cdc.shop.products", 0, 9), 55)
    assert sink.truncate(ROUTE, truncate) == 0


def test_soft_deletes_mark_held_rows_only_and_a_snapshot_end_marks_older_ones(
    writer_kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """`on_delete: soft`, through either writer: the MERGE updates a held row with the mark
    and inserts none (its tombstone still fences); a snapshot's end marks the rows older than
    it that are not marked yet (`mark_older`), where a TRUNCATE deletes them."""
    shape = SinkShape("delta", "m.yaml: tables.shop.products.delta", on_delete=OnDelete.SOFT)
    soft = dataclasses.replace(ROUTE, shapes={"delta": shape})
    sink = make_sink(writer_kind, tmp_path, request)
    first = change("c", 10, 1, product(1))
    assert first.schema is not None
    sink.ensure_target(soft, soft.sink_schema("delta", first.schema))

    def write(*changes: Change) -> None:
        shaped = soft.sink_changes(first.schema, list(changes))["delta"]
        assert not sink.apply(soft, shaped).failures

    write(first, change("c", 10, 2, product(2)))
    write(change("d", 20, 1), change("d", 20, 3))  # 3: never held
    stored = rows(tmp_path)
    assert sorted(stored) == [1, 2]
    assert stored[1]["_cdc_is_deleted"] is True and stored[1]["name"] == "Keyboard"
    write(change("c", 15, 3, product(3)))  # older than 3's delete: fenced by its tombstone
    assert sorted(rows(tmp_path)) == [1, 2]
    end = Truncate(ROUTE.table, 50, Coordinates("cdc.shop.products", 0, 9), None, 1_800_000_000_000)
    assert sink.truncate(soft, dataclasses.replace(end, snapshot_end=True)) == 1
    stored = rows(tmp_path)
    assert stored[2]["_cdc_is_deleted"] is True and stored[2]["_cdc_version"] == 49
    assert stored[2]["_cdc_deleted_at"] == datetime(2027, 1, 15, 8, tzinfo=UTC)
    assert stored[1]["_cdc_version"] == 20  # marked before: kept as it was
    assert sink.truncate(soft, end) == 2 and rows(tmp_path) == {}  # a TRUNCATE removes


def test_a_kept_table_handle_reads_the_log_only_when_another_writer_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bringing a handle up to date lists the whole log directory (its cost grows with every
    commit kept): a handle whose table nobody else committed to since, its own commits
    included, is used as it is; another writer's commit is still read."""
    path = tmp_path / "t"
    write_deltalake(str(path), pa.table({"id": [1]}))
    handles = TableHandles()
    kept = handles.get(path)
    assert kept is not None
    listed: list[int] = []
    update = DeltaTable.update_incremental

    def counted(self: DeltaTable) -> None:
        listed.append(1)
        update(self)

    monkeypatch.setattr(DeltaTable, "update_incremental", counted)
    write_deltalake(kept, pa.table({"id": [2]}), mode="append")  # the handle's own commit
    assert handles.get(path) is kept and kept.version() == 1
    assert listed == []
    write_deltalake(str(path), pa.table({"id": [3]}), mode="append")  # another writer
    again = handles.get(path)
    assert again is kept and again.version() == 2 and listed == [1]
    assert sorted(again.to_pyarrow_table()["id"].to_pylist()) == [1, 2, 3]
    assert handles.get(path) is kept and listed == [1]
