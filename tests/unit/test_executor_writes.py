"""The executor side of the writes, without Spark: a task's stage function, and the relay that
carries a task's sink waits to the driver while the task still runs."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pyarrow as pa
import pytest

from cdc_sync.core.model import Change, Truncate
from cdc_sync.core.retry import RetryPolicy
from cdc_sync.job.decode.partition import (
    KIND_CHANGE,
    KIND_STATS,
    decode_and_fold,
    load_change,
)
from cdc_sync.job.settle.schema_changes import SchemaState
from cdc_sync.job.spark_session import MASTER_VAR, spark_master
from cdc_sync.job.stream import PartitionSplit, SideRows
from cdc_sync.job.write.health import SinkHealth, SinkState
from cdc_sync.job.write.health_relay import HealthRelay, RelayObserver
from cdc_sync.job.write.table_writes import write_table
from cdc_sync.job.write.task_sinks import TaskSinkSpec
from cdc_sync.job.write.task_writes import WRITE_COLUMNS, WritePlan, load_writes, write_partition
from cdc_sync.mapping import TableRoute
from cdc_sync.schema import RowSchema, row_schema_from_connect
from cdc_sync.sinks.base import WriteResult
from tests.changes import products_route
from tests.envelopes import PRODUCT_FIELDS, envelope_bytes, key_bytes, product

pytestmark = pytest.mark.unit
PRODUCTS_SCHEMA = row_schema_from_connect({"type": "struct", "fields": PRODUCT_FIELDS})


def folded_partition(versions: dict[int, list[int]]) -> pa.Table:
    """One Kafka partition's records (key -> its versions, in log order), decoded and folded."""
    records = [
        (key_bytes("products", {"id": key}), envelope_bytes("products", "u", v, product(key)))
        for key, key_versions in versions.items()
        for v in key_versions
    ]
    batch = pa.RecordBatch.from_pydict(
        {
            "key": [k for k, _ in records],
            "value": [v for _, v in records],
            "topic": ["cdc.shop.products"] * len(records),
            "partition": [2] * len(records),
            "offset": list(range(len(records))),
        }
    )
    table = pa.Table.from_batches(list(decode_and_fold(iter([batch]))))
    return table.filter(pa.compute.equal(table["kind"], KIND_CHANGE)).select(list(WRITE_COLUMNS))


def test_a_write_task_writes_its_tables_and_hands_back_deferred_changes_with_schemas() -> None:
    route = products_route()
    spec = TaskSinkSpec("opensearch", None, None, 60, RetryPolicy(attempts=1))  # no row sinks
    plan = WritePlan({"shop.products": (route, SchemaState(RowSchema(()), False))}, spec, True)
    folded = folded_partition({1: [3, 9], 2: [4]})
    out = list(write_partition(iter(folded.to_batches()), plan))
    ((written,),) = load_writes([row for batch in out for row in batch.to_pylist()])
    assert written.progress.changes == 2 and written.progress.max_version == 9
    assert sorted(c.version for c in written.deferred["search"]) == [4, 9]
    assert all(
        c.schema is not None for c in written.deferred["search"]
    )  # rebuilt from the first row


def test_an_unrouted_table_is_not_written() -> None:
    spec = TaskSinkSpec("opensearch", None, None, 60, RetryPolicy(attempts=1))
    out = list(
        write_partition(iter(folded_partition({1: [3]}).to_batches()), WritePlan({}, spec, True))
    )
    assert load_writes([row for batch in out for row in batch.to_pylist()]) == [[]]


def wait_for(condition: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "the relay did not deliver"
        time.sleep(0.02)


def test_a_task_waiting_for_a_sink_shows_in_the_drivers_log_and_status(
    caplog: pytest.LogCaptureFixture,
) -> None:
    health = SinkHealth(["search"])
    relay = HealthRelay(health)
    try:
        observer = RelayObserver(relay.address)
        with caplog.at_level(logging.WARNING, logger="cdc_sync.job.write.health_relay"):
            observer.waiting("search", "bulk of 3 actions", 1_700_000_000.0, TimeoutError())
            wait_for(lambda: health.status()["search"].state is SinkState.WAITING)
        status = health.status()["search"]
        assert (status.what, status.error_class) == ("bulk of 3 actions", "TimeoutError")
        assert "executor task" in caplog.text and "waiting for sink search" in caplog.text
        observer.recovered("search", "bulk of 3 actions")
        wait_for(lambda: health.status()["search"].state is SinkState.OK)
        observer.gave_up("search", "bulk of 3 actions", 1_700_000_000.0, TimeoutError())
        wait_for(lambda: health.status()["search"].state is SinkState.FAILED)
    finally:
        relay.close()


def test_a_lost_report_never_fails_the_write(tmp_path: Path) -> None:
    health = SinkHealth(["search"])
    relay = HealthRelay(health)
    address = relay.address
    relay.close()  # nobody listens any more
    RelayObserver(address).waiting("search", "bulk", 0.0, TimeoutError())


def test_spark_submit_keeps_its_master_unless_the_job_setting_names_one() -> None:
    assert spark_master({}) == "local[2]"
    assert spark_master({"PYSPARK_GATEWAY_PORT": "41234"}) is None  # spark-submit's --master
    both = {"PYSPARK_GATEWAY_PORT": "41234", MASTER_VAR: "spark://10.0.0.5:7077"}
    assert spark_master(both) == "spark://10.0.0.5:7077"


def stats_row(task: str, offset: int) -> dict[str, object]:
    return {
        "kind": KIND_STATS,
        "counted": KIND_CHANGE,
        "topic": "cdc.shop.products",
        "partition": 1,
        "offset": offset,
        "count": 10,
        "task": task,
    }


def test_a_kafka_partition_split_over_two_tasks_fails_the_batch_before_any_write() -> None:
    """Folding in the task is only right if a Kafka partition reaches one task whole."""
    side = SideRows([stats_row("t1", 9), stats_row("t1", 9)])
    assert side.offsets == {("cdc.shop.products", 1): 9} and side.counts[KIND_CHANGE] == 20
    with pytest.raises(PartitionSplit, match="partition 1 was read by 2 Spark tasks"):
        SideRows([stats_row("t1", 9), stats_row("t2", 19)])


class MeetingSink:
    """A row sink whose write returns only once the other sink's write has started too."""

    def __init__(self, name: str, meeting: threading.Barrier, fails: bool = False) -> None:
        self.name = name
        self.meeting = meeting
        self.fails = fails
        self.applied: list[int] = []

    def truncate(self, route: TableRoute, truncate: Truncate) -> int:
        return 0

    def apply(self, route: TableRoute, changes: Sequence[Change]) -> WriteResult:
        self.meeting.wait(timeout=5)  # written one after the other, this breaks
        if self.fails:
            raise ConnectionError(f"{self.name} is down")
        self.applied = [c.version for c in changes]
        return WriteResult(applied=len(changes))

    def ensure_target(self, route: TableRoute, schema: RowSchema | None) -> None: ...

    def record_watermark(self, routes: Mapping[str, TableRoute], position: int) -> None: ...

    def close(self) -> None: ...


def folded_changes(versions: dict[int, list[int]]) -> list[Change]:
    return [load_change(row) for row in folded_partition(versions).to_pylist()]


def test_a_tables_row_sinks_are_written_at_once_and_each_reports_its_own_time() -> None:
    meeting = threading.Barrier(2)
    search, cache = MeetingSink("search", meeting), MeetingSink("redis", meeting)
    changes = [
        dataclasses.replace(c, schema=PRODUCTS_SCHEMA) for c in folded_changes({1: [3], 2: [5]})
    ]
    written = write_table(products_route(), SchemaState(PRODUCTS_SCHEMA, False), changes,
                          [search, cache], None)  # fmt: skip
    assert search.applied == cache.applied == [3, 5]
    assert set(written.results) == set(written.seconds) == {"search", "redis"}


def test_a_failing_sink_fails_the_table_write_after_the_other_sink_finished() -> None:
    meeting = threading.Barrier(2)
    search, cache = MeetingSink("search", meeting, fails=True), MeetingSink("redis", meeting)
    changes = [dataclasses.replace(c, schema=PRODUCTS_SCHEMA) for c in folded_changes({1: [3]})]
    with pytest.raises(ConnectionError, match="search is down"):
        write_table(products_route(), SchemaState(PRODUCTS_SCHEMA, False), changes,
                    [search, cache], None)  # fmt: skip
    assert cache.applied == [3]
