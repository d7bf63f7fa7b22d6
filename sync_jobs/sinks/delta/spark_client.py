"""The same fenced writes through delta-spark, used when the io.delta jars are on the classpath.

Production runs (spark-submit with `--packages io.delta:delta-spark_2.13:<v>`) take this path; the
local stack has no Maven access and uses deltalake (client.py). Same MERGE plan, same tombstones.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import Column

from sync_jobs.mapping import DeltaRoute
from sync_jobs.sinks.base import WriteResult
from sync_jobs.sinks.delta.actions import VERSION, DeltaActions
from sync_jobs.sinks.delta.merge_plan import merge_plan, spark_quote
from sync_jobs.sinks.delta.target import (
    TOMBSTONE_DELETED_AT,
    TOMBSTONE_ID,
    TOMBSTONE_SCHEMA,
    ensure_tombstones,
    open_table,
    table_path,
    tombstone_path,
)

DELTA_TABLES_CLASS = "io.delta.tables.DeltaTable"


def delta_spark_available(spark: Any) -> bool:
    """True when the delta-spark jars are loadable in the session's JVM."""
    try:
        spark._jvm.java.lang.Class.forName(DELTA_TABLES_CLASS)
    except Exception:
        return False
    return True


class DeltaSparkWriter:
    def __init__(self, spark: Any, warehouse: Path) -> None:
        from delta.tables import DeltaTable  # imported lazily: needs the jars at runtime

        self.spark = spark
        self.warehouse = warehouse
        self._delta_table = DeltaTable

    def write_batch(self, route: DeltaRoute, actions: DeltaActions) -> WriteResult:
        q = spark_quote
        deleted = actions.deleted_ids
        stones_path = str(tombstone_path(self.warehouse, route))
        ensure_tombstones(self.warehouse, route)  # a delete may come before any upsert
        if deleted:
            now = datetime.now(tz=UTC)
            stones = self.spark.createDataFrame(
                pa.table(
                    {
                        TOMBSTONE_ID: [i for i, _ in deleted],
                        VERSION: [v for _, v in deleted],
                        TOMBSTONE_DELETED_AT: [now] * len(deleted),
                    },
                    schema=TOMBSTONE_SCHEMA,
                ).to_pandas()
            )
            (
                self._delta_table.forPath(self.spark, stones_path)
                .alias("t")
                .merge(stones.alias("s"), f"t.{q(TOMBSTONE_ID)} = s.{q(TOMBSTONE_ID)}")
                .whenMatchedUpdateAll(condition=f"s.{q(VERSION)} > t.{q(VERSION)}")
                .whenNotMatchedInsertAll()
                .execute()
            )
        source = self.spark.createDataFrame(actions.source.to_pandas())
        source = source.withColumn("_cdc_id", _doc_id_column(actions))
        tombstones = self.spark.read.format("delta").load(stones_path)
        fenced = source.join(
            tombstones.withColumnRenamed(VERSION, "_stone_version"),
            on=source["_cdc_id"] == tombstones[TOMBSTONE_ID],
            how="left",
        ).where(f"NOT _cdc_deleted AND _stone_version IS NOT NULL AND {VERSION} <= _stone_version")
        fenced_count = fenced.count()
        live = source.join(fenced.select("_cdc_id"), on="_cdc_id", how="left_anti").drop("_cdc_id")
        plan = merge_plan(actions, q)
        target = table_path(self.warehouse, route)
        upserts = sum(1 for c in actions.changes if not c.is_delete)
        if open_table(target) is None and upserts == 0:
            # Deletes of rows the table never held: the tombstones above are all there is to do.
            return WriteResult(applied=len(actions.changes) - fenced_count, fenced=fenced_count)
        metrics = (
            self._delta_table.forPath(self.spark, str(target))
            .alias("t")
            .merge(live.alias("s"), plan.predicate)
            .whenMatchedDelete(condition=plan.delete_when)
            .whenMatchedUpdate(condition=plan.update_when, set=_expressions(plan.updates))
            .whenNotMatchedInsert(condition=plan.insert_when, values=_expressions(plan.inserts))
            .execute()
        )
        # Delta 3+ answers the merge with one row of metrics; an equal-version re-apply changes
        # nothing and counts as fenced, as with deltalake.
        row = metrics.first() if metrics is not None else None
        live_count = len(actions.changes) - fenced_count
        if row is None:
            return WriteResult(applied=live_count, fenced=fenced_count)
        deletes = len(actions.changes) - upserts
        missing_deletes = max(0, deletes - int(row["num_deleted_rows"]))
        applied = min(live_count, int(row["num_affected_rows"]) + missing_deletes)
        return WriteResult(applied=applied, fenced=fenced_count + live_count - applied)


def _doc_id_column(actions: DeltaActions) -> Any:
    from pyspark.sql import functions as F

    parts = [F.col(spark_quote(k)).cast("string") for k in actions.key_columns]
    return F.concat_ws("|", *parts)


def _expressions(columns: dict[str, str]) -> dict[str, str | Column]:
    return dict(columns)
