"""One table's share of a micro-batch, written to the row sinks: where the writes happen.

The same function runs in a Spark executor task (one per input partition, `job.write.task_writes`)
and in process (`BatchApplier.apply`): fill unchanged-TOAST columns from Postgres, conform to
the schema the driver accepted, route, write each sink, and report what happened. Sinks that
commit once per table and batch (Delta) are not written here: the routed changes go back to
the driver (`deferred`), which commits them once the tasks are done.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from cdc_sync.core.model import Change, Op, TableId, TruncateFence
from cdc_sync.documents import DOCUMENTS_DEFERRED
from cdc_sync.job.settle.schema_changes import SchemaState
from cdc_sync.job.write.unavailable import SourceFiller
from cdc_sync.mapping import TableRoute, sink_section
from cdc_sync.sinks.base import Sink, WriteResult


@dataclass(frozen=True)
class TableProgress:
    """What one batch applied to one table: the newest version and source commit time among its
    compacted changes (what metrics, watermarks and lag are computed from)."""

    changes: int = 0
    max_version: int | None = None
    max_source_ts_ms: int | None = None
    snapshot_rows: int = 0  # changes that are snapshot reads (op r): the initial-load progress

    def add(self, change: Change) -> TableProgress:
        return self.combine(
            TableProgress(1, change.version, change.source_ts_ms, int(change.op is Op.READ))
        )

    def combine(self, other: TableProgress) -> TableProgress:
        """Both shares of a table (two input partitions of one batch) together."""
        return TableProgress(
            self.changes + other.changes,
            _max(self.max_version, other.max_version),
            _max(self.max_source_ts_ms, other.max_source_ts_ms),
            self.snapshot_rows + other.snapshot_rows,
        )


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


@dataclass
class TableWrite:
    """What writing one table's changes (of one partition, or of the batch) did."""

    table: TableId
    results: dict[str, WriteResult] = field(default_factory=dict)  # per sink name
    seconds: dict[str, float] = field(default_factory=dict)  # per sink name, and "fill"
    progress: TableProgress = field(default_factory=TableProgress)
    gone: int = 0  # placeholders of rows deleted since: left out (job.write.unavailable)
    truncated: int = 0  # changes older than the table's TRUNCATE: dropped (job.settle.truncates)
    # Routed and shaped, per sink section (search, cache, delta), for the driver's sinks.
    deferred: dict[str, list[Change]] = field(default_factory=dict)


def write_table(
    route: TableRoute,
    schema: SchemaState,
    changes: Sequence[Change],
    sinks: Sequence[Sink],
    filler: SourceFiller | None,
    defer: bool = False,
    fence: TruncateFence | None = None,
) -> TableWrite:
    """`changes`: compacted (one per key), each with its schema; `defer`: hand the routed
    changes back for sinks that commit on the driver; `fence`: the table's newest TRUNCATE
    (`job.settle.truncates`), whose older changes are dropped: the truncate removed them."""
    written = TableWrite(route.table)
    if fence is not None:
        kept = [change for change in changes if not fence.covers(change)]
        written.truncated = len(changes) - len(kept)
        changes = kept
    if filler is not None:
        started = time.monotonic()
        changes, written.gone = filler.fill(route.table, changes, schema.schema)
        written.seconds["fill"] = time.monotonic() - started
    # After the fill: filters and computed fields read whole rows (`cdc_sync.shape`).
    conformed = [schema.conform(c) for c in changes]
    per_sink = route.sink_changes(schema.schema, conformed)
    if route.delta is not None and route.delta.history and "delta" in per_sink:
        per_sink["delta"] = [_with_earlier(route, schema, c, fence) for c in per_sink["delta"]]
    for change in changes:
        written.progress = written.progress.add(change)
    for name, result, seconds in _apply_each(route, per_sink, sinks):
        written.results[name] = result
        written.seconds[name] = seconds
    if defer:
        written.deferred = per_sink
    if route.documents:  # the driver's document step reads whole rows, filled
        written.deferred = {**written.deferred, DOCUMENTS_DEFERRED: conformed}
    return written


def _with_earlier(
    route: TableRoute, schema: SchemaState, routed: Change, fence: TruncateFence | None
) -> Change:
    """A Delta history's change (its Delta shape is plain: `mapping`) with the earlier versions
    it carries (`Change.earlier`) routed too, without those the table's TRUNCATE covers."""
    if not routed.earlier:
        return routed
    earlier = tuple(
        route.route(schema.conform(state))
        for state in routed.earlier
        if fence is None or not fence.covers(state)
    )
    return dataclasses.replace(routed, earlier=earlier)


def _apply_each(
    route: TableRoute, per_sink: Mapping[str, Sequence[Change]], sinks: Sequence[Sink]
) -> list[tuple[str, WriteResult, float]]:
    """Each sink's result and seconds. The sinks are written at once, a thread each: they
    wait on different servers, so a table's write takes its slowest sink's time, not the sum
    (each sink is fenced on its own; none depends on another's write)."""

    def apply(sink: Sink) -> tuple[str, WriteResult, float]:
        started = time.monotonic()
        result = sink.apply(route, per_sink.get(sink_section(sink.name), ()))
        return sink.name, result, time.monotonic() - started

    if len(sinks) <= 1:
        return [apply(sink) for sink in sinks]
    with ThreadPoolExecutor(len(sinks), thread_name_prefix="sink-write") as pool:
        return list(pool.map(apply, sinks))  # the first sink's error, once all have finished
