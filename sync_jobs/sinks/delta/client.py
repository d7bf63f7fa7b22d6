"""Fenced writes to Delta through deltalake (delta-rs): tombstones first, then one MERGE."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from sync_jobs.mapping import DeltaRoute
from sync_jobs.sinks.base import WriteResult
from sync_jobs.sinks.delta.actions import DELETED, VERSION, DeltaActions
from sync_jobs.sinks.delta.merge_plan import datafusion_quote, merge_plan
from sync_jobs.sinks.delta.target import (
    TOMBSTONE_DELETED_AT,
    TOMBSTONE_ID,
    TOMBSTONE_SCHEMA,
    ensure_tombstones,
    open_table,
    table_path,
    tombstone_path,
)


class DeltaLakeWriter:
    def __init__(self, warehouse: Path, tombstone_retention_seconds: int) -> None:
        self.warehouse = warehouse
        self.retention = timedelta(seconds=tombstone_retention_seconds)
        self._last_prune: dict[str, float] = {}

    def write_batch(self, route: DeltaRoute, actions: DeltaActions) -> WriteResult:
        self._record_tombstones(route, actions)
        source, fenced = self._drop_fenced_by_tombstones(route, actions)
        if source.num_rows == 0:
            return WriteResult(fenced=fenced)
        table = open_table(table_path(self.warehouse, route))
        if table is None and not pc.any(pc.invert(source[DELETED])).as_py():
            # Deletes of rows the table never held (it does not exist yet): the tombstones
            # recorded above are all there is to do.
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
        # A delete of a key the table never held still applied: its tombstone is recorded.
        missing_deletes = max(0, deletes - int(metrics.get("num_target_rows_deleted", 0)))
        applied = min(source.num_rows, changed + missing_deletes)
        self._maybe_prune(route)
        return WriteResult(applied=applied, fenced=fenced + source.num_rows - applied)

    def _record_tombstones(self, route: DeltaRoute, actions: DeltaActions) -> None:
        deleted = actions.deleted_ids
        if not deleted:
            return
        now = datetime.now(tz=UTC)
        source = pa.table(
            {
                TOMBSTONE_ID: [doc_id for doc_id, _ in deleted],
                VERSION: [version for _, version in deleted],
                TOMBSTONE_DELETED_AT: [now] * len(deleted),
            },
            schema=TOMBSTONE_SCHEMA,
        )
        ensure_tombstones(self.warehouse, route)  # a delete may come before any upsert
        table = open_table(tombstone_path(self.warehouse, route))
        assert table is not None
        q = datafusion_quote
        newer = f"s.{q(VERSION)} > t.{q(VERSION)}"
        (
            table.merge(
                source,
                predicate=f"t.{q(TOMBSTONE_ID)} = s.{q(TOMBSTONE_ID)}",
                source_alias="s",
                target_alias="t",
            )
            .when_matched_update_all(predicate=newer)
            .when_not_matched_insert_all()
            .execute()
        )

    def _drop_fenced_by_tombstones(
        self, route: DeltaRoute, actions: DeltaActions
    ) -> tuple[pa.Table, int]:
        """Upserts not newer than a recorded delete of the same key are stale: drop them."""
        upsert_ids = {c.doc_id: c.version for c in actions.changes if not c.is_delete}
        table = open_table(tombstone_path(self.warehouse, route))
        if not upsert_ids or table is None:
            return actions.source, 0
        # The tombstone table is small (pruned after the retention): filter in memory, where
        # delta-rs' string_view columns compare fine with a plain string value set.
        stones = table.to_pyarrow_table(columns=[TOMBSTONE_ID, VERSION])
        ids = stones[TOMBSTONE_ID].cast(pa.string())
        stones = pa.table({TOMBSTONE_ID: ids, VERSION: stones[VERSION]}).filter(
            pc.is_in(ids, value_set=pa.array(list(upsert_ids), type=pa.string()))
        )
        deleted_at = dict(
            zip(stones[TOMBSTONE_ID].to_pylist(), stones[VERSION].to_pylist(), strict=True)
        )
        keep = [
            change.is_delete or change.version > deleted_at.get(change.doc_id, -1)
            for change in actions.changes
        ]
        fenced = keep.count(False)
        return (actions.source.filter(pa.array(keep)) if fenced else actions.source), fenced

    def _maybe_prune(self, route: DeltaRoute) -> None:
        """Forget tombstones older than the retention, at most every tenth of it."""
        path = tombstone_path(self.warehouse, route)
        now = time.monotonic()
        if now - self._last_prune.get(str(path), 0.0) < self.retention.total_seconds() / 10:
            return
        self._last_prune[str(path)] = now
        table = open_table(path)
        if table is not None:
            cutoff = (datetime.now(tz=UTC) - self.retention).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            table.delete(f"{datafusion_quote(TOMBSTONE_DELETED_AT)} < '{cutoff}'")
