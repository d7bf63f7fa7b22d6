"""Driver side of a micro-batch: route compacted changes, evolve targets, fan out to the sinks.

Raising from here fails the Spark batch, so its offsets are not committed and the batch re-runs
after a restart (invariant 3); sinks are idempotent and fenced, so the re-run is harmless.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cdc_sync.core.model import Change, Coordinates, TableId
from cdc_sync.job.dead_letter import DeadLetter, DeadLetterWriter
from cdc_sync.job.schema_changes import SchemaTracker
from cdc_sync.job.schema_store import SchemaStore
from cdc_sync.job.unavailable import SourceFiller
from cdc_sync.mapping import MappingFile, OnMalformed, OnTombstone, TableRoute
from cdc_sync.schema import RowSchema
from cdc_sync.sinks.base import Sink, WriteResult

log = logging.getLogger(__name__)


class PolicyViolation(RuntimeError):
    """A record the mapping's policy says to fail on; the message names the setting."""


@dataclass(frozen=True)
class Rejected:
    """A record that did not become a change: a Kafka tombstone, or a malformed record."""

    kind: str  # "tombstone" | "malformed"
    coordinates: Coordinates
    table: TableId | None
    error_field: str | None = None
    error_class: str | None = None
    message: str | None = None
    key: bytes | None = None
    value: bytes | None = None


@dataclass(frozen=True)
class TableProgress:
    """What one batch applied to one table: the newest version and source commit time among its
    compacted changes (what metrics, watermarks and lag are computed from)."""

    changes: int = 0
    max_version: int | None = None
    max_source_ts_ms: int | None = None

    def add(self, change: Change) -> TableProgress:
        ts = change.source_ts_ms
        return TableProgress(
            self.changes + 1,
            change.version if self.max_version is None else max(self.max_version, change.version),
            ts if self.max_source_ts_ms is None or ts is None else max(self.max_source_ts_ms, ts),
        )


@dataclass
class BatchMetrics:
    batch_id: int
    records: int = 0
    changes: int = 0
    compacted: int = 0
    tombstones: int = 0
    malformed: int = 0
    dead_lettered: int = 0
    unavailable_gone: int = 0  # placeholders of rows deleted since: left out (job.unavailable)
    sinks: dict[str, WriteResult] = field(default_factory=dict)
    seconds: float = 0.0
    # Seconds per stage, so a slow stage shows without a profiler: decode and fold (Spark, set
    # by job.stream), fill (Postgres reads of placeholders), one entry per sink, dead_letter.
    stages: dict[str, float] = field(default_factory=dict)
    # Highest Kafka offset read per (topic, partition) in this batch (set by job.stream).
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    # Per routed table, what this batch applied (every sink acknowledged it when observers run).
    tables: dict[TableId, TableProgress] = field(default_factory=dict)

    def timed(self, stage: str, started: float) -> None:
        self.stages[stage] = self.stages.get(stage, 0.0) + time.monotonic() - started

    def reconciles(self) -> bool:
        """Every record is accounted for, and every compacted change by every sink."""
        inputs_ok = self.records == self.changes + self.tombstones + self.malformed
        return inputs_ok and all(
            r.applied + r.fenced + len(r.failures) <= self.compacted for r in self.sinks.values()
        )

    def summary(self) -> str:
        per_sink = " ".join(
            f"{name}=applied:{r.applied},fenced:{r.fenced},failed:{len(r.failures)}"
            for name, r in self.sinks.items()
        )
        return (
            f"batch {self.batch_id}: records={self.records} changes={self.changes} "
            f"compacted={self.compacted} tombstones={self.tombstones} malformed={self.malformed} "
            f"dead_lettered={self.dead_lettered} unavailable_gone={self.unavailable_gone} "
            f"{per_sink} in {self.seconds:.2f}s "
            f"({' '.join(f'{name}:{took:.2f}s' for name, took in self.stages.items())})"
        )


BatchObserver = Callable[[BatchMetrics], None]


class BatchApplier:
    def __init__(
        self,
        mapping: MappingFile,
        sinks: Sequence[Sink],
        dead_letters: DeadLetterWriter | None,
        filler: SourceFiller | None = None,
        schema_store: SchemaStore | None = None,
        observers: Sequence[BatchObserver] = (),
    ) -> None:
        self.mapping = mapping
        self.sinks = list(sinks)
        self.dead_letters = dead_letters
        self.filler = filler
        # Without a store the accepted schemas last as long as this applier (unit tests).
        self.schemas = SchemaTracker(mapping, schema_store)
        self.history: list[BatchMetrics] = []
        # Called with each batch's metrics once every sink acknowledged it (before Spark commits
        # its offsets): metrics, watermarks, status. An observer that raises fails the batch.
        self.observers: list[BatchObserver] = list(observers)

    def apply(
        self,
        batch_id: int,
        records: int,
        changes: int,
        compacted: Sequence[Change],
        rejected: Sequence[Rejected],
        schemas: dict[str, RowSchema],
        schema_fps: Sequence[str | None],
        tombstone_deletes: int = 0,
        stage_seconds: dict[str, float] | None = None,
        offsets: dict[tuple[str, int], int] | None = None,
    ) -> BatchMetrics:
        """`tombstone_deletes`: tombstones applied as deletes (counted as tombstones; their
        deletes are among `compacted`); `stage_seconds`: the Spark stages' times; `offsets`: the
        highest offset read per (topic, partition)."""
        started = time.monotonic()
        metrics = BatchMetrics(batch_id, records=records, changes=changes, compacted=len(compacted))
        metrics.stages.update(stage_seconds or {})
        metrics.offsets.update(offsets or {})
        metrics.tombstones += tombstone_deletes
        letters = self._handle_rejected(rejected, metrics)
        by_table: dict[TableId, list[Change]] = defaultdict(list)
        for change, fingerprint in zip(compacted, schema_fps, strict=True):
            schema = schemas.get(fingerprint) if fingerprint else None
            by_table[change.table].append(_with_schema(change, schema))
        for table, table_changes in sorted(by_table.items()):
            route = self.mapping.route_for(table)
            if route is None:
                continue  # not subscribed; only ignored tables' topics can get here
            letters += self._apply_table(route, table_changes, metrics)
        if letters:
            if self.dead_letters is None:
                raise PolicyViolation(
                    "records need dead-lettering but no dead-letter writer is set"
                )
            letters_started = time.monotonic()
            self.dead_letters.write(letters)
            metrics.timed("dead_letter", letters_started)
        metrics.dead_lettered = len(letters)
        metrics.seconds = time.monotonic() - started
        log.info("%s", metrics.summary())
        self.history.append(metrics)
        for observe in self.observers:
            observe(metrics)
        return metrics

    def _apply_table(
        self, route: TableRoute, changes: list[Change], metrics: BatchMetrics
    ) -> list[DeadLetter]:
        if self.filler is not None:
            fill_started = time.monotonic()
            changes, gone = self.filler.fill(route.table, changes)
            metrics.unavailable_gone += gone
            metrics.timed("fill", fill_started)
        # Deletes carry no row schema: the newest change that has one tells the table's schema.
        with_schema = [c for c in changes if c.schema is not None]
        newest = max(with_schema, key=lambda c: c.version) if with_schema else None
        schema = self.schemas.observe(route, newest.schema if newest else None)
        if schema.evolved:
            for sink in self.sinks:
                sink.ensure_target(route, route.project_schema(schema.schema))
            self.schemas.targets_ready(route.table)
        routed = [route.route(schema.conform(change)) for change in changes]
        progress = metrics.tables.get(route.table, TableProgress())
        for change in changes:
            progress = progress.add(change)
        metrics.tables[route.table] = progress
        letters: list[DeadLetter] = []
        for sink in self.sinks:
            sink_started = time.monotonic()
            result = sink.apply(route, routed)
            metrics.timed(sink.name, sink_started)
            previous = metrics.sinks.get(sink.name, WriteResult())
            metrics.sinks[sink.name] = previous.merge(result)
            if result.failures and route.policies.on_malformed is OnMalformed.FAIL:
                first = result.failures[0]
                raise PolicyViolation(
                    f"{first.change.coordinates}: {sink.name} refused {len(result.failures)} "
                    f"record(s) of {route.table} ({first.error_class}: {first.message}); set "
                    f"{self.mapping.setting_path(route.table, 'on_malformed')}: dead_letter "
                    "to dead-letter such records and keep going"
                )
            letters += [
                DeadLetter(
                    coordinates=failure.change.coordinates,
                    sink=sink.name,
                    stage="write",
                    error_class=failure.error_class,
                    message=failure.message,
                    key=failure.change.doc_id.encode(),
                    value=_change_json(failure.change),
                )
                for failure in result.failures
            ]
        return letters

    def _handle_rejected(
        self, rejected: Sequence[Rejected], metrics: BatchMetrics
    ) -> list[DeadLetter]:
        letters: list[DeadLetter] = []
        for record in rejected:
            policies = self.mapping.policies_for(record.table)
            if record.kind == "tombstone":
                metrics.tombstones += 1
                if policies.on_tombstone is OnTombstone.FAIL:
                    raise PolicyViolation(
                        f"{record.coordinates}: Kafka tombstone (null value) received; set "
                        f"{self.mapping.setting_path(record.table, 'on_tombstone')}: delete "
                        "to apply them as deletes (log compaction), or skip to ignore them"
                    )
                continue
            metrics.malformed += 1
            if policies.on_malformed is OnMalformed.FAIL:
                raise PolicyViolation(
                    f"{record.coordinates}: malformed record at {record.error_field}: "
                    f"{record.message}; set "
                    f"{self.mapping.setting_path(record.table, 'on_malformed')}: dead_letter "
                    "to dead-letter such records and keep going"
                )
            letters.append(
                DeadLetter(
                    coordinates=record.coordinates,
                    sink="none",
                    stage="parse",
                    error_class=record.error_class or "MalformedRecord",
                    message=f"{record.error_field}: {record.message}",
                    key=record.key,
                    value=record.value,
                )
            )
        return letters


def _with_schema(change: Change, schema: RowSchema | None) -> Change:
    if schema is None or change.schema is not None:
        return change
    from dataclasses import replace

    return replace(change, schema=schema)


def _change_json(change: Change) -> bytes:
    """The routed change for the dead-letter value; values the JSON lacks become strings."""
    document: dict[str, Any] = {
        "table": str(change.table),
        "key": {name: value for name, value in change.key},
        "op": change.op.value,
        "version": change.version,
        "row": dict(change.row) if change.row is not None else None,
        "unavailable_columns": sorted(change.unavailable_columns),
    }
    return json.dumps(document, default=str).encode()
