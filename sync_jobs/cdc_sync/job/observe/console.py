"""What the job shows on the console: one concise line per batch that changed something (an
idle job: one line a minute), and a progress view of the initial snapshot (rows synced per
table against the catalog's estimate, rate, ETA) on a TTY.

Both are batch observers; the detailed per-batch summary goes to the log file (`core.logs`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
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
from cdc_sync.core.lsn import format_lsn
from cdc_sync.core.model import TableId
from cdc_sync.job.observe.status_file import batch_seconds
from cdc_sync.job.settle.applier import BatchMetrics

console_log = logging.getLogger(CONSOLE)
log = logging.getLogger(__name__)


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
    if metrics.documents:
        parts.append(f"{metrics.documents} documents rendered")
    if metrics.dead_lettered:
        parts.append(f"{metrics.dead_lettered} dead-lettered")
    newest = [p.max_source_ts_ms for p in metrics.tables.values() if p.max_source_ts_ms]
    if newest:
        parts.append(f"lag {max(0, now_ms - max(newest)) / 1000:.1f} s")
    parts.append(f"{batch_seconds(metrics):.1f} s")
    return "; ".join(parts)


# An idle job says so once a minute; its heartbeat-only batches (one a heartbeat interval)
# go to the log file only.
IDLE_LINE_SECONDS = 60.0


def is_quiet(metrics: BatchMetrics) -> bool:
    """Nothing to show: no routed table changed and nothing was rejected or refused (a batch
    of heartbeats only, or an empty one)."""
    return (
        not metrics.tables
        and not metrics.malformed
        and not metrics.tombstones
        and not metrics.dead_lettered
        and not any(r.failures for r in metrics.sinks.values())
    )


def idle_line(
    idle_seconds: float, batches: int, lag_seconds: float | None, watermark: int | None
) -> str:
    """`idle 5 min: 60 heartbeat batches since the last line; lag 0.8 s; watermark 0/1A2B3C8`.
    Lag: now minus the source commit time of the newest heartbeat applied."""
    parts = [f"idle {_duration(idle_seconds)}: {batches} heartbeat batches since the last line"]
    if lag_seconds is not None:
        parts.append(f"lag {max(0.0, lag_seconds):.1f} s")
    parts.append(f"watermark {format_lsn(watermark) if watermark is not None else 'none yet'}")
    return "; ".join(parts)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds // 3600:.0f} h {seconds % 3600 / 60:.0f} min"


class BatchLine:
    """After each batch, what the console shows: the batch line for a batch that changed a
    routed table (or rejected something); for heartbeat-only batches nothing, but one idle
    line a minute. Every batch line goes to the log file, and with `-v` to the console too.

    `watermark`: the applied watermark this job last recorded (job.observe.watermarks)."""

    def __init__(
        self,
        watermark: Callable[[], int | None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
        every_seconds: float = IDLE_LINE_SECONDS,
        consumer: str | None = None,
    ) -> None:
        """`consumer`: the consumer of the log whose batches these are (its lines start with
        its name)."""
        self.prefix = f"{consumer}: " if consumer else ""
        self.watermark = watermark
        self.clock = clock
        self.every_seconds = every_seconds
        started = clock()
        self.last_change_at = started  # the last batch that changed something (or the start)
        self.last_line_at = started  # the last line on the console
        self.quiet_batches = 0  # since the last line

    def console_line(self, metrics: BatchMetrics, now_ms: int | None = None) -> str | None:
        """The line the console shows for this batch, None for none (the decision)."""
        now = self.clock()
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        if not is_quiet(metrics):
            self.last_change_at = self.last_line_at = now
            self.quiet_batches = 0
            return batch_line(metrics, now_ms)
        self.quiet_batches += 1
        if now - self.last_line_at < self.every_seconds:
            return None
        lag = (now_ms - metrics.source_ts_ms) / 1000 if metrics.source_ts_ms else None
        line = idle_line(now - self.last_change_at, self.quiet_batches, lag, self.watermark())
        self.last_line_at = now
        self.quiet_batches = 0
        return line

    def __call__(self, metrics: BatchMetrics) -> None:
        now_ms = int(time.time() * 1000)
        line = batch_line(metrics, now_ms)
        shown = self.console_line(metrics, now_ms)
        if shown is not None:
            console_log.info("%s%s", self.prefix, shown)
        if shown != line:
            log.info("%s%s", self.prefix, line)  # the log file (and the console with -v)


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
    """A live view of the initial snapshot: one bar per table, counting the rows every consumer
    routing the table has synced (the slowest one's). Shown from the job's start on a fresh
    checkpoint (the initial load is coming) or from the first batch of snapshot rows; ends with
    a summary line once every consumer that loaded snapshot rows has a batch without them, or
    when the job stops."""

    def __init__(
        self,
        estimates: Mapping[TableId, int | None],
        expect_snapshot: bool,
        console: Console | None = None,
        consumers_of: Mapping[TableId, Collection[str]] | None = None,
    ) -> None:
        """`consumers_of`: per table, the consumers whose rows count (default: whichever
        reports it)."""
        self.estimates = dict(estimates)
        self.console = console or Console()
        self.consumers_of = {t: frozenset(c) for t, c in (consumers_of or {}).items()}
        self.progress: Progress | None = None
        self.tasks: dict[TableId, TaskID] = {}
        self.rows: dict[TableId, int] = {}  # synced by every consumer routing the table
        self.loaded: dict[tuple[str, TableId], int] = {}  # per consumer and table
        self.loading: set[str] = set()  # consumers that applied snapshot rows
        self.finished: set[str] = set()  # of those, the ones whose load is over
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

    def observer(self, consumer: str) -> Callable[[BatchMetrics], None]:
        """The batch observer of one consumer of the log."""
        return lambda metrics: self.observe(metrics, consumer)

    def __call__(self, metrics: BatchMetrics) -> None:
        self.observe(metrics, "job")

    def observe(self, metrics: BatchMetrics, consumer: str) -> None:
        if self.done:
            return
        snapshot = {t: p.snapshot_rows for t, p in metrics.tables.items() if p.snapshot_rows}
        if not snapshot:
            # A batch without snapshot rows after some: this consumer's initial load is over.
            if consumer in self.loading:
                self.finished.add(consumer)
            expected = set().union(*self.consumers_of.values()) or self.loading
            over = self.loading and self.finished >= expected
            if self.progress is not None and (over or (not self.loading and metrics.compacted)):
                self.close()
            return
        self.loading.add(consumer)
        self.finished.discard(consumer)
        if self.progress is None:
            self._open()
        assert self.progress is not None
        elapsed = max(time.monotonic() - self.started, 1e-6)
        for table, rows in snapshot.items():
            self.loaded[(consumer, table)] = self.loaded.get((consumer, table), 0) + rows
            routing = self.consumers_of.get(table) or {consumer}
            self.rows[table] = min(self.loaded.get((name, table), 0) for name in routing)
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
