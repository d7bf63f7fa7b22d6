"""The same fenced writes through delta-spark, used when the io.delta jars are on the classpath.

Production runs (spark-submit with `--packages io.delta:delta-spark_2.13:<v>`) take this path; the
local stack has no Maven access and uses deltalake (client.py). Same MERGE plan, same tombstones.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Column

from cdc_sync.mapping import DeltaRoute
from cdc_sync.sinks.base import WriteResult
from cdc_sync.sinks.delta.actions import DeltaActions, marks_predicate, truncate_predicate
from cdc_sync.sinks.delta.merge_plan import merge_plan, spark_quote
from cdc_sync.sinks.delta.target import open_table, table_path
from cdc_sync.sinks.delta.tombstones import TombstoneStore

DELTA_TABLES_CLASS = "io.delta.tables.DeltaTable"


def delta_spark_available(spark: Any) -> bool:
    """True when the delta-spark jars are loadable in the session's JVM."""
    try:
        spark._jvm.java.lang.Class.forName(DELTA_TABLES_CLASS)
    except Exception:
        return False
    return True


class DeltaSparkWriter:
    def __init__(self, spark: Any, warehouse: Path, tombstone_retention_seconds: int) -> None:
        from delta.tables import DeltaTable  # imported lazily: needs the jars at runtime

        self.spark = spark
        self.warehouse = warehouse
        self.tombstones = TombstoneStore(warehouse, tombstone_retention_seconds)
        self._delta_table = DeltaTable

    def write_batch(self, route: DeltaRoute, actions: DeltaActions) -> WriteResult:
        q = spark_quote
        self.tombstones.record(route, actions)
        source, fenced_count = self.tombstones.drop_fenced(route, actions)
        if source.num_rows == 0:
            return WriteResult(fenced=fenced_count)
        live = self.spark.createDataFrame(source.to_pandas())
        plan = merge_plan(actions, q)
        target = table_path(self.warehouse, route)
        upserts = sum(1 for c in actions.changes if not c.is_delete)
        inserting = sum(1 for c in actions.changes if not (c.is_delete or c.marks_deleted))
        if open_table(target) is None and inserting == 0:
            # Deletes (and marks) of rows the table never held: the tombstones above are all
            # there is to do.
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
        self.tombstones.maybe_prune(route)
        if row is None:
            return WriteResult(applied=live_count, fenced=fenced_count)
        deletes = len(actions.changes) - upserts
        missing_deletes = max(0, deletes - int(row["num_deleted_rows"]))
        applied = min(live_count, int(row["num_affected_rows"]) + missing_deletes)
        return WriteResult(applied=applied, fenced=fenced_count + live_count - applied)

    def truncate(self, route: DeltaRoute, version: int) -> int:
        """delta-spark's DELETE reports no row count: the rows removed are counted first."""
        target = table_path(self.warehouse, route)
        if open_table(target) is None:
            return 0
        table = self._delta_table.forPath(self.spark, str(target))
        predicate = truncate_predicate(version)
        removed = int(table.toDF().where(predicate).count())
        table.delete(predicate)
        return removed

    def mark_older(
        self, route: DeltaRoute, version: int, marker: str, values: Mapping[str, Any]
    ) -> int:
        """delta-spark's UPDATE reports no row count: the rows marked are counted first."""
        from pyspark.sql import functions

        target = table_path(self.warehouse, route)
        if open_table(target) is None:
            return 0
        table = self._delta_table.forPath(self.spark, str(target))
        predicate = marks_predicate(version, spark_quote(marker))
        marked = int(table.toDF().where(predicate).count())
        table.update(predicate, {spark_quote(k): functions.lit(v) for k, v in values.items()})
        return marked


def _expressions(columns: dict[str, str]) -> dict[str, str | Column]:
    return dict(columns)
