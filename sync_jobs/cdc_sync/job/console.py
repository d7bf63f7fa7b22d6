"""What the job shows on the console: one concise line per batch, and a progress view of the
initial snapshot (rows synced per table against the catalog's estimate, rate, ETA) on a TTY.

Both are batch observers; the detailed per-batch summary goes to the log file (`core.logs`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from psycopg import sql
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from cdc_sync.core.logs import CONSOLE
from cdc_sync.core.model import TableId
from cdc_sync.job.applier import BatchMetrics
from cdc_sync.job.status_file import batch_seconds

console_log = logging.getLogger(CONSOLE)


def batch_line(metrics: BatchMetrics, now_ms: int | None = None) -> str:
    """`batch 7: 447 records, 161 changes; search 161/0 redis 161/0 (applied/fenced); lag 1.3 s;
    11.4 s`. Lag: now minus the source commit time of the newest change applied."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    parts = [f"batch {metrics.batch_id}: {metrics.records} records, {metrics.compacted} changes"]
    if metrics.sinks:
        sinks = " ".join(
            f"{name} {r.applied}/{r.fenced}"
            + (f" ({len(r.failures)} failed)" if r.failures else "")
            for name, r in metrics.sinks.items()
        )
        parts.append(f"{sinks} (applied/fenced)")
    if metrics.dead_lettered:
        parts.append(f"{metrics.dead_lettered} dead-lettered")
    newest = [p.max_source_ts_ms for p in metrics.tables.values() if p.max_source_ts_ms]
    if newest:
        parts.append(f"lag {max(0, now_ms - max(newest)) / 1000:.1f} s")
    parts.append(f"{batch_seconds(metrics):.1f} s")
    return "; ".join(parts)


class BatchLine:
    """Logs `batch_line` to the console logger after each batch."""

    def __call__(self, metrics: BatchMetrics) -> None:
        console_log.info("%s", batch_line(metrics))


# A table the catalog has no estimate for (never analyzed) is counted when at most this big.
EXACT_COUNT_MAX_BYTES = 64 * 1024 * 1024


def catalog_estimates(conn: Any, tables: list[TableId]) -> dict[TableId, int | None]:
    """Rows per table as the catalog estimates them (`pg_class.reltuples`). A table never
    analyzed (reltuples -1) is counted exactly when small; else, or when missing, None."""
    estimates: dict[TableId, int | None] = {}
    for table in tables:
        row = conn.execute(
            "SELECT c.reltuples, pg_relation_size(c.oid) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s",
            (table.schema, table.table),
        ).fetchone()
        if row is None:
            estimates[table] = None
        elif row[0] >= 0:
            estimates[table] = int(row[0])
        elif row[1] <= EXACT_COUNT_MAX_BYTES:
            quoted = sql.SQL("SELECT count(*) FROM {}.{}").format(
                sql.Identifier(table.schema), sql.Identifier(table.table)
            )
            estimates[table] = int(conn.execute(quoted).fetchone()[0])
        else:
            estimates[table] = None
    return estimates


class SnapshotProgress:
    """A live view of the initial snapshot: one bar per table. Shown from the job's start on a
    fresh checkpoint (the initial load is coming) or from the first batch of snapshot rows;
    ends with a summary line once a batch carries no snapshot rows, or when the job stops."""

    def __init__(
        self,
        estimates: Mapping[TableId, int | None],
        expect_snapshot: bool,
        console: Console | None = None,
    ) -> None:
        self.estimates = dict(estimates)
        self.console = console or Console()
        self.progress: Progress | None = None
        self.tasks: dict[TableId, TaskID] = {}
        self.rows: dict[TableId, int] = {}
        self.started = 0.0
        self.done = False
        self.expect_snapshot = expect_snapshot

    def start(self) -> None:
        """The job starts: show the view now if the initial load is coming."""
        if self.expect_snapshot and self.progress is None and not self.done:
            self._open()

    def _open(self) -> None:
        self.started = time.monotonic()
        self.progress = Progress(
            TextColumn("snapshot {task.description:<28}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
        )
        for table, estimate in sorted(self.estimates.items()):
            self.tasks[table] = self.progress.add_task(str(table), total=estimate, rate="")
        self.progress.start()

    def __call__(self, metrics: BatchMetrics) -> None:
        if self.done:
            return
        snapshot = {t: p.snapshot_rows for t, p in metrics.tables.items() if p.snapshot_rows}
        if not snapshot:
            if self.progress is not None and (self.rows or metrics.compacted):
                self.close()  # streamed changes and no snapshot rows: the initial load is over
            return
        if self.progress is None:
            self._open()
        assert self.progress is not None
        elapsed = max(time.monotonic() - self.started, 1e-6)
        for table, rows in snapshot.items():
            self.rows[table] = self.rows.get(table, 0) + rows
            task = self.tasks.get(table)
            if task is None:
                task = self.tasks[table] = self.progress.add_task(str(table), total=None, rate="")
            estimate = self.estimates.get(table)
            total = max(estimate, self.rows[table]) if estimate is not None else None
            self.progress.update(
                task,
                completed=self.rows[table],
                total=total,
                rate=f"{self.rows[table] / elapsed:,.0f} rows/s",
            )

    def close(self) -> None:
        if self.done:
            return
        self.done = True
        if self.progress is not None:
            self.progress.stop()
            if self.rows:
                total = sum(self.rows.values())
                console_log.info(
                    "snapshot: %d rows of %d table(s) synced in %.0f s",
                    total,
                    len(self.rows),
                    time.monotonic() - self.started,
                )
