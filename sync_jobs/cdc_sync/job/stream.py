"""Spark side of a micro-batch: decode on executors, compact per key, hand over to the driver."""

from __future__ import annotations

import pickle
import time
from functools import partial
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from cdc_sync.core.model import Coordinates, KnownSchemas, TableId
from cdc_sync.job.applier import BatchApplier, BatchMetrics, Rejected
from cdc_sync.job.decode import (
    CHANGE_KINDS,
    DECODED_SCHEMA,
    KIND_CHANGE,
    KIND_TOMBSTONE_DELETE,
    decode_batches,
    fold_batches,
    load_change,
)
from cdc_sync.schema import RowSchema

DECODED_SPARK = from_arrow_schema(DECODED_SCHEMA)  # one schema: decode.py's Arrow one


class MicroBatchProcessor:
    """`foreachBatch` callable: offsets commit only if this returns without raising."""

    def __init__(
        self, applier: BatchApplier, partitions: int = 2, known: KnownSchemas | None = None
    ) -> None:
        self.applier = applier
        self.partitions = partitions
        self.known = known  # catalog schemas for records without one; shipped to executors
        self.tombstone_deletes = applier.mapping.tombstone_delete_tables()

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        self.process(batch, batch_id)

    def process(self, batch: DataFrame, batch_id: int) -> BatchMetrics:
        decoded = batch.select("key", "value", "topic", "partition", "offset").mapInArrow(
            partial(decode_batches, known=self.known, tombstone_deletes=self.tombstone_deletes),
            DECODED_SPARK,
        )
        decoded = decoded.persist(StorageLevel.MEMORY_AND_DISK)
        stages: dict[str, float] = {}
        try:
            started = time.monotonic()  # read + decode: the first action runs both
            counts: dict[str, int] = {}
            offsets: dict[tuple[str, int], int] = {}
            for row in (
                decoded.groupBy("kind", "topic", "partition")
                .agg(F.count("*").alias("count"), F.max("offset").alias("offset"))
                .collect()
            ):
                counts[row["kind"]] = counts.get(row["kind"], 0) + row["count"]
                where = (row["topic"], row["partition"])
                offsets[where] = max(offsets.get(where, -1), row["offset"])
            side = (
                decoded.where(f"kind NOT IN {CHANGE_KINDS} OR schema_blob IS NOT NULL")
                .drop("change")
                .toArrow()
                .to_pylist()
            )
            stages["decode"] = time.monotonic() - started
            started = time.monotonic()
            compacted = (
                decoded.where(f"kind IN {CHANGE_KINDS}")
                .repartition(self.partitions, "table", "doc_id")
                .sortWithinPartitions("table", "doc_id", "version", "partition", "offset")
                .mapInArrow(fold_batches, DECODED_SPARK)
                .select("change", "schema_fp")
                .toArrow()
                .to_pylist()
            )
            stages["fold"] = time.monotonic() - started
        finally:
            decoded.unpersist()
        return self.applier.apply(
            batch_id,
            records=sum(counts.values()),
            changes=counts.get(KIND_CHANGE, 0),
            tombstone_deletes=counts.get(KIND_TOMBSTONE_DELETE, 0),
            compacted=[load_change(row) for row in compacted],
            rejected=[_rejected(row) for row in side if row["kind"] not in CHANGE_KINDS],
            schemas=_schemas(side),
            schema_fps=[row["schema_fp"] for row in compacted],
            stage_seconds=stages,
            offsets=offsets,
        )


def _schemas(rows: list[dict[str, Any]]) -> dict[str, RowSchema]:
    found: dict[str, RowSchema] = {}
    for row in rows:
        if row.get("schema_blob") and row["schema_fp"] not in found:
            schema = pickle.loads(row["schema_blob"])
            assert isinstance(schema, RowSchema)
            found[row["schema_fp"]] = schema
    return found


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
