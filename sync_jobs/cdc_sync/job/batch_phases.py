"""The two phases of a micro-batch, run by Spark tasks or, for small batches, on the driver.

Phase 1 decodes and folds each input partition (`decode.decode_and_fold`) and returns the side
rows the driver settles the batch with; phase 2 writes each partition's folded changes
(`task_writes.write_partition`) and returns every partition's `TableWrite`s. Both runners call
the same two functions on the same per-partition input, so a batch's outcome does not depend on
where it ran.

- `SparkPhases`: two Spark jobs over the batch's DataFrame, one task per Kafka partition, in
  parallel on the executors (no shuffle: a key never leaves its partition).
- `DriverPhases`: the driver reads the batch's offset ranges (from the checkpoint's offset log)
  itself with the source's own reader, a consumer per range as in a task (one kept across
  ranges waited behind its long-polling fetch of the previous range on every reassignment:
  seconds a batch), several ranges at once, and runs both functions in process. The reads go
  through the process's `RecentReads`: the consumers of one application plan the same ranges
  within a second or two, and the broker is asked for them once (source.recent_reads). A Spark
  job costs ~0.2-0.5 s of scheduling, Python worker hops and Arrow transfers whatever its size;
  a batch of a few hundred records spent most of its time there. Small batches skip both jobs;
  large ones (the initial snapshot, a backlog) still spread over the executors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import from_arrow_schema

from cdc_sync.job.decode.partition import FOLDED_SCHEMA, KIND_CHANGE
from cdc_sync.job.write.table_writes import TableWrite
from cdc_sync.job.write.task_writes import (
    WRITE_COLUMNS,
    WRITES_SCHEMA,
    WritePlan,
    load_writes,
    write_partition,
)
from cdc_sync.source.checkpoint import batch_end_offsets
from cdc_sync.source.data_loss import Watermarks, batch_ranges, moved_back
from cdc_sync.source.offsets import PartitionRange, TopicPartition
from cdc_sync.source.options import KafkaSourceOptions
from cdc_sync.source.python_kafka import broker_watermarks
from cdc_sync.source.recent_reads import SHARED, RecentReads

FOLDED_SPARK = from_arrow_schema(FOLDED_SCHEMA)  # one schema: decode.py's Arrow one
WRITES_SPARK = from_arrow_schema(WRITES_SCHEMA)
INPUT_COLUMNS = ("key", "value", "topic", "partition", "offset")
# A small batch's ranges the driver reads from the broker at once (DriverPhases).
READERS = 4

# The broker's (low, high) watermarks of some partitions (source.python_kafka.broker_watermarks).
WatermarksOf = Callable[
    [KafkaSourceOptions, Sequence[TopicPartition]], Mapping[TopicPartition, Watermarks]
]
# Arrow batches of one partition in, folded rows (changes, then side rows) out.
DecodeFold = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


class BatchPhases(Protocol):
    ran_on: str  # "executors" or "driver"

    def decode(self, decode_fold: DecodeFold) -> list[dict[str, Any]]:
        """Phase 1 over every partition; the side rows (not the changes) of all of them."""
        ...

    def write(self, plan: WritePlan) -> list[list[TableWrite]]:
        """Phase 2: per partition, its `TableWrite`s."""
        ...

    def close(self) -> None: ...


class SparkPhases:
    """Both phases as Spark jobs over the batch, the folded partitions persisted in between."""

    ran_on = "executors"

    def __init__(self, batch: DataFrame) -> None:
        self.batch = batch
        self.folded: DataFrame | None = None

    def decode(self, decode_fold: DecodeFold) -> list[dict[str, Any]]:
        folded = self.batch.select(*INPUT_COLUMNS).mapInArrow(decode_fold, FOLDED_SPARK)
        self.folded = folded.persist(StorageLevel.MEMORY_AND_DISK)
        side = self.folded.where(f"kind != '{KIND_CHANGE}'").drop("change")
        return side.toArrow().to_pylist()

    def write(self, plan: WritePlan) -> list[list[TableWrite]]:
        assert self.folded is not None, "decode() first"
        rows = (
            self.folded.where(f"kind = '{KIND_CHANGE}'")
            .select(*WRITE_COLUMNS)
            .mapInArrow(partial(write_partition, plan=plan), WRITES_SPARK)
            .toArrow()
            .to_pylist()
        )
        return load_writes(rows)

    def close(self) -> None:
        if self.folded is not None:
            self.folded.unpersist()


class DriverPhases:
    """Both phases in the driver process over the ranges it read from Kafka itself."""

    ran_on = "driver"

    def __init__(
        self,
        options: KafkaSourceOptions,
        ranges: list[PartitionRange],
        readers: Executor,
        reads: RecentReads = SHARED,
    ) -> None:
        """`readers`: the threads the ranges are read on (`SmallBatches` keeps them across
        batches: `read_pool`)."""
        self.options = options
        self.ranges = ranges
        self.reads = reads
        self.readers = readers
        self.changes: list[list[pa.RecordBatch]] = []  # per partition, in Kafka order

    def decode(self, decode_fold: DecodeFold) -> list[dict[str, Any]]:
        """Every range read from the broker at once (up to READERS), each decoded and folded
        in range order as its read arrives: a batch's time at the broker is its slowest
        range's, not the sum of all (a consumer and a fetch each, 0.05-0.3 s)."""
        side: list[dict[str, Any]] = []
        for records in self.readers.map(self._records, self.ranges):
            side += self._decode(decode_fold, records)
        return side

    def _records(self, span: PartitionRange) -> list[pa.RecordBatch]:
        return list(self.reads.read(self.options, span))

    def _decode(
        self, decode_fold: DecodeFold, records: list[pa.RecordBatch]
    ) -> list[dict[str, Any]]:
        """One partition's records decoded and folded (in offset order, on this thread: the
        version floors rise record by record); its changes kept for the write phase, its side
        rows returned."""
        folded = pa.Table.from_batches(list(decode_fold(iter(records))), schema=FOLDED_SCHEMA)
        is_change = pc.equal(folded["kind"], KIND_CHANGE)
        self.changes.append(folded.filter(is_change).select(list(WRITE_COLUMNS)).to_batches())
        return folded.filter(pc.invert(is_change)).drop_columns(["change"]).to_pylist()

    def write(self, plan: WritePlan) -> list[list[TableWrite]]:
        rows = [
            row
            for batches in self.changes
            for out in write_partition(iter(batches), plan)
            for row in out.to_pylist()
        ]
        return load_writes(rows)

    def close(self) -> None:
        self.changes.clear()


def read_pool() -> ThreadPoolExecutor:
    """Threads for a small batch's range reads: up to READERS at once."""
    return ThreadPoolExecutor(READERS, thread_name_prefix="batch-read")


class SmallBatches:
    """Decides which batches run on the driver: those of at most `max_records` offsets whose
    ranges the checkpoint's offset log gives (every batch after the first)."""

    def __init__(
        self,
        options: KafkaSourceOptions,
        checkpoint_dir: Path,
        max_records: int,
        watermarks: WatermarksOf = broker_watermarks,
        reads: RecentReads = SHARED,
    ) -> None:
        self.options = options
        self.checkpoint_dir = checkpoint_dir
        self.max_records = max_records
        self.watermarks = watermarks  # asked only when planning rebased a partition
        self.reads = reads
        # Kept across batches: starting and joining a batch's own threads took a quarter of a
        # small batch's time on a busy driver (py-spy: ~30 ms of ~0.12 s, 2026-11-28).
        self.readers = read_pool()

    def phases(self, batch: DataFrame, batch_id: int) -> BatchPhases:
        ranges = self._ranges(batch_id)
        if ranges is None:
            return SparkPhases(batch)
        return DriverPhases(self.options, ranges, self.readers, self.reads)

    def _ranges(self, batch_id: int) -> list[PartitionRange] | None:
        """The batch's ranges, or None when the batch is large or its start is not in the
        offset log. They follow the source's own rule (`batch_ranges`): a partition planning
        rebased (a re-created topic under failOnDataLoss=false) starts at its low watermark,
        not at the previous batch's end. Each range's start is checked against the broker
        when it is read (`consume_range`: failOnDataLoss, as the source's own tasks do)."""
        if self.max_records <= 0 or batch_id == 0:
            return None
        start = batch_end_offsets(self.checkpoint_dir, batch_id - 1)
        end = batch_end_offsets(self.checkpoint_dir, batch_id)
        if start is None or end is None:
            return None
        rebased = moved_back(start, end)
        if rebased:  # the topic was re-created: its offsets mean other records now
            self.reads.forget(self.options, rebased)
        ranges = batch_ranges(
            start,
            end,
            self.watermarks(self.options, rebased) if rebased else {},
            fail_on_data_loss=self.options.fail_on_data_loss,
        )
        if sum(span.size for span in ranges) > self.max_records:
            return None
        return ranges
