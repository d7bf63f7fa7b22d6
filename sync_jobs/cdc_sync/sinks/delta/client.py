"""Fenced writes to Delta through deltalake (delta-rs): one MERGE of the unfenced changes while
the batch's deletes are appended to the tombstone table beside it. Both commit before the batch
does; either may land alone if the job dies between them, and the replayed batch writes both
again (an append of the same tombstones only repeats rows whose highest version counts)."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_sync.mapping import DeltaRoute
from cdc_sync.sinks.base import WriteResult
from cdc_sync.sinks.delta.actions import (
    DELETED,
    MARK,
    DeltaActions,
    marks_predicate,
    truncate_predicate,
)
from cdc_sync.sinks.delta.handles import TableHandles
from cdc_sync.sinks.delta.merge_plan import datafusion_quote, datafusion_string, merge_plan
from cdc_sync.sinks.delta.target import table_path
from cdc_sync.sinks.delta.tombstones import TombstoneStore

# Tables whose tombstones record at once: as many as the driver commits tables in parallel.
RECORDERS = 8


class DeltaLakeWriter:
    def __init__(self, warehouse: Path, tombstone_retention_seconds: int) -> None:
        self.warehouse = warehouse
        self.handles = TableHandles()  # the data tables and their tombstone tables
        self.tombstones = TombstoneStore(
            warehouse, tombstone_retention_seconds, handles=self.handles
        )
        # Kept across batches (tables commit in parallel, each records its tombstones beside
        # its MERGE): a pool a write started and joined its thread every batch.
        self._recorders = ThreadPoolExecutor(RECORDERS, thread_name_prefix="delta-tombstones")

    def write_batch(self, route: DeltaRoute, actions: DeltaActions) -> WriteResult:
        source, fenced = self.tombstones.drop_fenced(route, actions)
        recording = self._recorders.submit(self.tombstones.record, route, actions)
        try:
            return self._merge(route, actions, source, fenced)
        finally:
            recording.result()  # its error, if any, fails the write too

    def truncate(self, route: DeltaRoute, version: int) -> int:
        table = self.handles.get(table_path(self.warehouse, route))
        if table is None:
            return 0  # no table yet: nothing to remove
        metrics = table.delete(truncate_predicate(version))
        return int(metrics.get("num_deleted_rows", 0))

    def mark_older(
        self, route: DeltaRoute, version: int, marker: str, values: Mapping[str, Any]
    ) -> int:
        table = self.handles.get(table_path(self.warehouse, route))
        if table is None:
            return 0
        predicate = marks_predicate(version, datafusion_quote(marker))
        updates = {datafusion_quote(k): _sql_literal(v) for k, v in values.items()}
        metrics = table.update(updates=updates, predicate=predicate)
        return int(metrics.get("num_updated_rows", 0))

    def _merge(
        self, route: DeltaRoute, actions: DeltaActions, source: pa.Table, fenced: int
    ) -> WriteResult:
        if source.num_rows == 0:
            return WriteResult(fenced=fenced)
        table = self.handles.get(table_path(self.warehouse, route))
        inserting = pc.invert(pc.or_(source[DELETED], source[MARK]))
        if table is None and not pc.any(inserting).as_py():
            # Deletes (and marks) of rows the table never held (it does not exist yet): the
            # tombstones recorded above are all there is to do.
            return WriteResult(applied=source.num_rows, fenced=fenced)
        if table is None:
            raise RuntimeError(f"Delta table {route.relative_path()} missing: ensure_target first")
        plan = merge_plan(actions, datafusion_quote)
        metrics = (
            table.merge(source, predicate=plan.predicate, source_alias="s", target_alias="t")
            .when_matched_delete(predicate=plan.delete_when)
            .when_matched_update(updates=plan.updates, predicate=plan.update_when)
            .when_not_matched_insert(updates=plan.inserts, predicate=plan.insert_when)
            .execute()
        )
        changed = sum(
            int(metrics.get(name, 0))
            for name in (
                "num_target_rows_inserted",
                "num_target_rows_updated",
                "num_target_rows_deleted",
            )
        )
        upserts = int(pc.sum(pc.invert(source[DELETED])).as_py() or 0)
        deletes = source.num_rows - upserts
        # A delete of a key the table never held still applied: its tombstone is recorded. (A
        # mark of a key it does not hold counts as fenced: the MERGE does not tell it apart.)
        missing_deletes = max(0, deletes - int(metrics.get("num_target_rows_deleted", 0)))
        applied = min(source.num_rows, changed + missing_deletes)
        self.tombstones.maybe_prune(route)
        return WriteResult(applied=applied, fenced=fenced + source.num_rows - applied)


def _sql_literal(value: Any) -> str:
    """A value of `mark_older` as a DataFusion literal (deltalake's `new_values` has no null)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, datetime):
        micros = (value - _EPOCH) // timedelta(microseconds=1)
        return f"arrow_cast({micros}, '{_UTC_MICROS}')"
    return datafusion_string(str(value))


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_UTC_MICROS = 'Timestamp(Microsecond, Some("UTC"))'  # the `_cdc_` timestamps' Arrow type
