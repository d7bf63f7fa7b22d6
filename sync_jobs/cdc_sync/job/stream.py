"""Spark side of a micro-batch: decode and fold per input partition, write row sinks in
executor tasks, commit the once-per-batch sinks on the driver.

No shuffle: Debezium keys a table's records by primary key, so all changes of a key sit in one
Kafka partition, and both Kafka sources give each Kafka partition of a batch one Spark
partition (the `cdc_kafka` source plans one range per topic-partition; the built-in source
does too unless `minPartitions` / `maxRecordsPerPartition` split it, which the job never sets).
So each task folds its keys completely, in Kafka order, and writes them.

Two phases per batch (`job.batch_phases`: Spark jobs, or on the driver for small batches):
1. decode + fold (`decode.decode_and_fold`); the driver collects only the side rows (rejected
   records, per-table schemas, counts, offsets) and settles policies, schema changes and
   targets (`BatchApplier.begin`) before anything is written;
2. writes (`task_writes.write_partition`): one task per partition, in parallel, writes search
   and cache and hands back results and the routed changes for Delta, which the driver then
   commits once per table (`BatchApplier.finish`).
A failed task fails the batch: `foreachBatch` raises and Spark commits no offsets (invariant 3).
"""

from __future__ import annotations

import pickle
import time
from collections import defaultdict
from collections.abc import Sequence
from functools import partial
from typing import Any

from pyspark.sql import DataFrame

from cdc_sync.core.model import Coordinates, KnownSchemas, TableId, Truncate, TruncateFence
from cdc_sync.job.batch_phases import SmallBatches, SparkPhases
from cdc_sync.job.decode.fold import OpenTransaction
from cdc_sync.job.decode.open_transactions import (
    FileOpenTransactions,
    OpenTransactions,
    StoredOpenTransactions,
    carried_on,
)
from cdc_sync.job.decode.partition import (
    KIND_CHANGE,
    KIND_OPEN,
    KIND_SNAPSHOT_END,
    KIND_STATS,
    KIND_TABLE,
    KIND_TOMBSTONE_DELETE,
    KIND_TRUNCATE,
    decode_and_fold,
    open_transaction,
)
from cdc_sync.job.decode.version_floors import (
    FileVersionFloors,
    Floors,
    StoredFloors,
    raised,
)
from cdc_sync.job.settle.applier import BatchApplier, BatchMetrics, Rejected
from cdc_sync.job.settle.schema_changes import SchemaState
from cdc_sync.job.write.table_writes import TableWrite
from cdc_sync.job.write.task_sinks import TaskSinkSpec
from cdc_sync.job.write.task_writes import WritePlan
from cdc_sync.schema import RowSchema
from cdc_sync.sinks.base import Sink


class MicroBatchProcessor:
    """`foreachBatch` callable: offsets commit only if this returns without raising.

    `spec`: how executor tasks open the row sinks; `driver_sinks`: sinks that commit once per
    table and batch on the driver (Delta); `known`: catalog schemas for records without one."""

    def __init__(
        self,
        applier: BatchApplier,
        spec: TaskSinkSpec,
        driver_sinks: Sequence[Sink] = (),
        known: KnownSchemas | None = None,
        floors_store: FileVersionFloors | None = None,
        small: SmallBatches | None = None,
        open_store: FileOpenTransactions | None = None,
    ) -> None:
        self.applier = applier
        self.spec = spec
        self.driver_sinks = list(driver_sinks)
        # The driver's own row sinks (search, cache): batches run on the driver write them.
        self.row_sinks = [sink for sink in applier.sinks if sink not in self.driver_sinks]
        self.known = known  # shipped to executors
        self.tombstone_deletes = applier.mapping.tombstone_delete_tables()
        self.history_tables = applier.mapping.history_tables()
        self.topic_tables = applier.mapping.topic_tables()
        # Highest snapshot point per partition (job.decode.version_floors), kept beside the
        # checkpoint.
        self.floors_store = floors_store
        self.floors = floors_store.load() if floors_store is not None else StoredFloors()
        # Per partition, the keys the last transaction created (job.decode.open_transactions).
        self.open_store = open_store
        self.open = open_store.load() if open_store is not None else StoredOpenTransactions()
        # Which batches run on the driver (batch_phases); None: every batch on the executors.
        self.small = small

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        self.process(batch, batch_id)

    def process(self, batch: DataFrame, batch_id: int) -> BatchMetrics:
        floors = self.floors.for_batch(batch_id)
        open_before = self.open.for_batch(batch_id)
        decode_fold = partial(
            decode_and_fold,
            known=self.known,
            tombstone_deletes=self.tombstone_deletes,
            floors=floors,
            open_transactions=open_before,
            history_tables=self.history_tables,
            tables=self.topic_tables,
        )
        phases = self.small.phases(batch, batch_id) if self.small else SparkPhases(batch)
        # On the driver the row sinks are written like Delta: every (table, sink) at once,
        # after the second phase filled and routed the changes (BatchApplier.finish).
        on_driver = phases.ran_on == "driver"
        driver_sinks = [*self.row_sinks, *self.driver_sinks] if on_driver else self.driver_sinks
        try:
            started = time.monotonic()  # read, decode and fold: the first phase runs all three
            summary = SideRows(phases.decode(decode_fold))
            stages = {"decode": time.monotonic() - started}
            plan = self.applier.begin(
                batch_id,
                records=sum(summary.counts.values()),
                changes=summary.counts.get(KIND_CHANGE, 0),
                compacted=summary.compacted,
                rejected=summary.rejected,
                table_schemas=summary.schemas,
                tombstone_deletes=summary.counts.get(KIND_TOMBSTONE_DELETE, 0),
                stage_seconds=stages,
                offsets=summary.offsets,
                commit_bound=summary.commit_bound,
                source_ts_ms=summary.source_ts_ms,
                ran_on=phases.ran_on,
                truncates=summary.truncates,
            )
            tasks: list[list[TableWrite]] = []
            if plan.schemas:
                started = time.monotonic()
                tasks = phases.write(self._write_plan(plan.schemas, plan.fences, on_driver))
                stages["write"] = time.monotonic() - started
        finally:
            phases.close()
        metrics = self.applier.finish(
            plan,
            [written for task in tasks for written in task],
            {"write": stages.get("write", 0.0), **_task_seconds(tasks)},
            driver_sinks,
        )
        self._keep_floors(batch_id, floors, summary.floors)
        self._keep_open(batch_id, open_before, summary.open)
        return metrics

    def _keep_floors(self, batch_id: int, before: Floors, points: Floors) -> None:
        """After every sink acknowledged, before Spark commits the offsets (version_floors)."""
        self.floors = StoredFloors(batch_id, before, raised(before, points))
        if self.floors_store is not None:
            self.floors_store.save(self.floors)

    def _keep_open(
        self,
        batch_id: int,
        before: OpenTransactions,
        reported: dict[tuple[str, int], OpenTransaction],
    ) -> None:
        """As the floors: what the next batch starts from, what a re-run of this one does."""
        self.open = StoredOpenTransactions(batch_id, before, carried_on(before, reported))
        if self.open_store is not None:
            self.open_store.save(self.open)

    def _write_plan(
        self,
        schemas: dict[TableId, SchemaState],
        fences: dict[TableId, TruncateFence],
        on_driver: bool,
    ) -> WritePlan:
        routes = {
            str(table): (self.applier.mapping.tables[table], state)
            for table, state in schemas.items()
        }
        by_name = {str(table): fence for table, fence in fences.items()}
        if on_driver:  # fill and route only: finish() writes every sink
            return WritePlan(routes, self.spec.without_row_sinks(), defer=True, fences=by_name)
        return WritePlan(routes, self.spec, defer=bool(self.driver_sinks), fences=by_name)


def _task_seconds(tasks: list[list[TableWrite]]) -> dict[str, float]:
    """Per sink (and "fill"), the seconds spent in it summed over the batch's tasks: the sink's
    share of the work. Tasks run in parallel, so the sum may exceed the `write` stage's wall."""
    spent: dict[str, float] = defaultdict(float)
    for task in tasks:
        for written in task:
            for stage, took in written.seconds.items():
                spent[stage] += took
    return dict(spent)


class PartitionSplit(RuntimeError):
    """One Kafka partition reached several tasks: per-key order needs one task per partition."""


class SideRows:
    """The side rows of all partitions, summed up for the driver."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.counts: dict[str, int] = defaultdict(int)
        self.offsets: dict[tuple[str, int], int] = {}
        self.floors: Floors = {}  # highest snapshot point per partition (job.decode.version_floors)
        self.commit_bound: int | None = None  # highest Change.commit_bound (job.observe.watermarks)
        self.source_ts_ms: int | None = None  # newest source commit time (job.observe.console)
        self.rejected: list[Rejected] = []
        self.truncates: list[Truncate] = []  # applied on the driver before the writes
        # Per partition, its last transaction and the keys it left open
        # (job.decode.open_transactions).
        self.open: dict[tuple[str, int], OpenTransaction] = {}
        self.compacted = 0
        self.schemas: dict[TableId, RowSchema | None] = {}
        newest: dict[TableId, int] = {}
        readers: dict[tuple[str, int], set[str]] = defaultdict(set)
        # Per (topic, table), per partition, the hashes of its keys folded there.
        keys: dict[tuple[str, str], dict[int, bytes]] = defaultdict(dict)
        for row in rows:
            if row["kind"] == KIND_STATS:
                self.counts[row["counted"]] += row["count"]
                where = (row["topic"], row["partition"])
                self.offsets[where] = max(self.offsets.get(where, -1), row["offset"])
                if row.get("floor") is not None:
                    self.floors[where] = max(self.floors.get(where, 0), row["floor"])
                if row.get("bound") is not None:
                    self.commit_bound = max(self.commit_bound or 0, row["bound"])
                if row.get("ts") is not None:
                    self.source_ts_ms = max(self.source_ts_ms or 0, row["ts"])
                readers[where].add(row["task"])
            elif row["kind"] == KIND_TABLE:
                table = TableId.parse(row["table"])
                self.compacted += row["count"]
                if row.get("keys"):
                    keys[(row["topic"], row["table"])][row["partition"]] = row["keys"]
                self.schemas.setdefault(table, None)
                version = row["version"]
                if row["schema_blob"] is not None and version >= newest.get(table, version):
                    newest[table] = version
                    schema = pickle.loads(row["schema_blob"])
                    assert isinstance(schema, RowSchema)
                    self.schemas[table] = schema
            elif row["kind"] == KIND_TRUNCATE:
                self.truncates.append(_truncate(row))
            elif row["kind"] == KIND_OPEN:
                self.open[(row["topic"], row["partition"])] = open_transaction(row)
            elif row["kind"] == KIND_SNAPSHOT_END:
                self.truncates.append(_truncate(row, snapshot_end=True))
            else:
                self.rejected.append(_rejected(row))
        split = sorted(where for where, tasks in readers.items() if len(tasks) > 1)
        if split:
            topic, partition = split[0]
            raise PartitionSplit(
                f"topic {topic!r} partition {partition} was read by {len(readers[split[0]])} "
                "Spark tasks in one batch: keys would be folded and written out of order. Do "
                "not set the Kafka source's minPartitions / maxRecordsPerPartition for this job"
            )
        for (topic, _), partitions in sorted(keys.items()):
            if len(partitions) > 1:
                _one_partition_per_key(topic, partitions)


class KeyAcrossPartitions(RuntimeError):
    """A key has changes in two Kafka partitions of one batch: folded apart, out of order."""


def _one_partition_per_key(topic: str, partitions: dict[int, bytes]) -> None:
    """Debezium keys a table's records by primary key, so a key stays in one partition, unless
    the topic's partition count changed under it: the key's newer records then hash to another
    partition than its older ones. Each partition is folded and written on its own (no
    shuffle), so such a batch would be applied out of order: it fails, before any write."""
    seen: dict[bytes, int] = {}
    for partition, packed in sorted(partitions.items()):
        for start in range(0, len(packed), 8):
            digest = packed[start : start + 8]
            first = seen.setdefault(digest, partition)
            if first != partition:
                raise KeyAcrossPartitions(
                    f"topic {topic!r}: a key has changes in partitions {first} and {partition} "
                    "of one batch. Debezium keys records by primary key, so this happens when "
                    "the topic's partition count changed while it was written: the job folds "
                    "each partition on its own and would apply that key's changes out of "
                    "order. Grow a topic only after the job drained it (stop capture, "
                    "`cdc-sync run --available-now`, grow, restart capture); now, recreate "
                    "the topic and re-snapshot its table into it, on a new checkpoint"
                )


def _truncate(row: dict[str, Any], snapshot_end: bool = False) -> Truncate:
    return Truncate(
        TableId.parse(row["table"]),
        row["version"],
        Coordinates(row["topic"], row["partition"], row["offset"]),
        row.get("position"),
        row.get("ts"),
        snapshot_end=snapshot_end,
    )


def _rejected(row: dict[str, Any]) -> Rejected:
    table = TableId.parse(row["table"]) if row.get("table") else None
    return Rejected(
        kind=row["kind"],
        coordinates=Coordinates(row["topic"], row["partition"], row["offset"]),
        table=table,
        error_field=row.get("error_field"),
        error_class=row.get("error_class"),
        message=row.get("error_message"),
        key=row.get("key"),
        value=row.get("value"),
    )
