"""Delete tombstones of a Delta table: the one home of delete fencing for both Delta writers.

A Delta MERGE cannot fence an upsert against a row that is gone, so each delete is remembered in
a small Delta table (`<warehouse>/_cdc_tombstones/<schema>/<table>`: id, version, deleted_at) for
the tombstone retention. Upserts older than a remembered delete of their key are stale and
dropped before the MERGE (an equal version is the same transaction, later in Kafka order).
Deletes are appended (a key deleted again has several rows; its highest version counts): an
append writes one small file, where a MERGE first read and rewrote the table on every batch
with deletes.
Both writers (deltalake and delta-spark) keep it through deltalake: the table is small, and one
code path means one behaviour (pruning included).

The recorded deletes are read from the table once and then kept (`_Recorded`), as long as the
table is the one read, at the version read plus this store's own appends: reading the whole
table for every batch with upserts was a third of a streaming batch's Delta time (2026-11-28,
`probe_batch_costs.py`: 0.11 of 0.38 s at 20 changes/s), and grew with the deletes of the
retention. Any other commit (a compaction, a prune, `cdc-sync maintain`, another writer, the
table replaced) changes the table's id or version, and the rows are read again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from cdc_sync.mapping import DeltaRoute
from cdc_sync.sinks.delta.actions import VERSION, DeltaActions
from cdc_sync.sinks.delta.handles import TableHandles
from cdc_sync.sinks.delta.merge_plan import datafusion_quote
from cdc_sync.sinks.delta.target import (
    TOMBSTONE_DELETED_AT,
    TOMBSTONE_ID,
    TOMBSTONE_SCHEMA,
    ensure_tombstones,
    open_table,
    tombstone_path,
)

# Every batch with deletes adds a file to the tombstone table, and every batch with upserts reads
# the whole table (`drop_fenced`): compacted this often, a read stays a few files, not one per
# batch of the retention (a day of one batch a second would be ~86,000 files).
COMPACT_EVERY_WRITES = 50
KEPT_CHUNKS = 64  # appended batches kept as chunks before they are combined into one
KEPT_SCHEMA = pa.schema([(TOMBSTONE_ID, pa.string()), (VERSION, pa.int64())])


@dataclass(frozen=True)
class _Recorded:
    """A tombstone table's rows (id as plain strings, version) as of one commit of it."""

    table_id: str  # the table's metadata id: a table replaced under its path has another
    version: int
    rows: pa.Table


class TombstoneStore:
    def __init__(
        self,
        warehouse: Path,
        retention_seconds: int,
        compact_every_writes: int = COMPACT_EVERY_WRITES,
        handles: TableHandles | None = None,
    ) -> None:
        self.warehouse = warehouse
        self.handles = handles or TableHandles()
        self.retention = timedelta(seconds=retention_seconds)
        self.compact_every_writes = compact_every_writes
        self._last_prune: dict[str, float] = {}
        self._writes: dict[str, int] = {}
        self._recorded: dict[str, _Recorded] = {}  # by tombstone table path

    def record(self, route: DeltaRoute, actions: DeltaActions) -> None:
        """Remember the batch's deletes (appended; a key's highest version counts)."""
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
        path = tombstone_path(self.warehouse, route)
        table = self.handles.get(path)
        if table is None:  # a delete may come before any upsert
            ensure_tombstones(self.warehouse, route)
            table = self.handles.get(path)
        assert table is not None
        before = table.version()
        write_deltalake(table, source, mode="append")  # brings the handle to its commit
        self._kept_after_append(str(path), table, before, source)
        self._maybe_compact(route)

    def _kept_after_append(
        self, key: str, table: DeltaTable, before: int, appended: pa.Table
    ) -> None:
        """The kept rows with `appended`, when this append is the only commit since they were
        read; otherwise they are read again at the next batch."""
        kept = self._recorded.get(key)
        table_id, version = _identity(table)
        if kept is None or (kept.table_id, kept.version) != (table_id, before):
            return
        if version != before + 1:  # another writer committed in between
            return
        rows = pa.concat_tables([kept.rows, _kept_rows(appended)])
        if rows[TOMBSTONE_ID].num_chunks > KEPT_CHUNKS:
            rows = rows.combine_chunks()
        self._recorded[key] = _Recorded(table_id, version, rows)

    def _maybe_compact(self, route: DeltaRoute) -> None:
        """Bin-pack the tombstone table's small files every `compact_every_writes` writes (the
        replaced files stay for time travel until a vacuum: `cdc-sync maintain`)."""
        path = str(tombstone_path(self.warehouse, route))
        self._writes[path] = self._writes.get(path, 0) + 1
        if self._writes[path] % self.compact_every_writes:
            return
        table = self.handles.get(tombstone_path(self.warehouse, route))
        if table is not None:
            table.optimize.compact()

    def drop_fenced(self, route: DeltaRoute, actions: DeltaActions) -> tuple[pa.Table, int]:
        """The batch's source rows without the stale upserts, and how many were dropped: fenced
        by the recorded deletes and by the batch's own, so it needs not wait for `record`."""
        upsert_ids = {c.doc_id: c.version for c in actions.changes if not c.is_delete}
        if not upsert_ids:
            return actions.source, 0
        deleted_at = self.recorded_deletes(route, list(upsert_ids))
        for doc_id, version in actions.deleted_ids:
            deleted_at[doc_id] = max(version, deleted_at.get(doc_id, version))
        keep = [
            change.is_delete or change.version >= deleted_at.get(change.doc_id, -1)
            for change in actions.changes
        ]
        fenced = keep.count(False)
        return (actions.source.filter(pa.array(keep)) if fenced else actions.source), fenced

    def recorded_deletes(self, route: DeltaRoute, doc_ids: list[str]) -> dict[str, int]:
        """The highest recorded delete version of each of `doc_ids` that has one."""
        path = tombstone_path(self.warehouse, route)
        table = self.handles.get(path)
        if table is None:
            self._recorded.pop(str(path), None)
            return {}
        stones = self._stones(str(path), table)
        newest = (
            stones.filter(
                pc.is_in(stones[TOMBSTONE_ID], value_set=pa.array(doc_ids, type=pa.string()))
            )
            .group_by(TOMBSTONE_ID, use_threads=False)  # a batch's few ids: no thread hops
            .aggregate([(VERSION, "max")])
        )
        return dict(
            zip(
                newest[TOMBSTONE_ID].to_pylist(),
                newest[f"{VERSION}_max"].to_pylist(),
                strict=True,
            )
        )

    def _stones(self, key: str, table: DeltaTable) -> pa.Table:
        """The table's rows (id, version), kept while the table and its version are the ones
        read (plus this store's own appends). The table is small (pruned after the retention):
        filtered in memory, where delta-rs' string_view ids compare fine as plain strings."""
        identity = _identity(table)
        kept = self._recorded.get(key)
        if kept is not None and (kept.table_id, kept.version) == identity:
            return kept.rows
        rows = _kept_rows(table.to_pyarrow_table(columns=[TOMBSTONE_ID, VERSION]))
        self._recorded[key] = _Recorded(*identity, rows)
        return rows

    def maybe_prune(self, route: DeltaRoute) -> None:
        """Forget tombstones older than the retention, at most every tenth of it."""
        path = tombstone_path(self.warehouse, route)
        now = time.monotonic()
        if now - self._last_prune.get(str(path), 0.0) < self.retention.total_seconds() / 10:
            return
        self._last_prune[str(path)] = now
        self.prune(route)

    def prune(self, route: DeltaRoute, dry_run: bool = False) -> int:
        """Forget the tombstones older than the retention now; returns how many (would) go."""
        table = open_table(tombstone_path(self.warehouse, route))
        if table is None:
            return 0
        cutoff = datetime.now(tz=UTC) - self.retention
        if dry_run:
            deleted_at = table.to_pyarrow_table(columns=[TOMBSTONE_DELETED_AT])[0]
            return int(pc.sum(pc.less(deleted_at, pa.scalar(cutoff, deleted_at.type))).as_py() or 0)
        stamp = cutoff.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        metrics = table.delete(f"{datafusion_quote(TOMBSTONE_DELETED_AT)} < '{stamp}'")
        return int(metrics.get("num_deleted_rows", 0))


def _identity(table: DeltaTable) -> tuple[str, int]:
    """Which table and commit a handle holds: its metadata id (a table replaced under its path
    has another) and version."""
    return str(table.metadata().id), table.version()


def _kept_rows(stones: pa.Table) -> pa.Table:
    """Tombstone rows as kept: ids as plain strings (delta-rs reads string_view), versions."""
    return pa.Table.from_arrays(
        [stones[TOMBSTONE_ID].cast(pa.string()), stones[VERSION].cast(pa.int64())],
        schema=KEPT_SCHEMA,
    )
