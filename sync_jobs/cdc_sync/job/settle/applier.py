"""Driver side of a micro-batch: policies, schema changes and targets before the writes;
once-per-batch commits, refused records, dead letters and observers after them.

Raising from here fails the Spark batch, so its offsets are not committed and the batch re-runs
after a restart (invariant 3); sinks are idempotent and fenced, so the re-run is harmless.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from cdc_sync.core.model import Change, Coordinates, TableId, Truncate, TruncateFence
from cdc_sync.documents import DOCUMENTS_DEFERRED, DocumentSync
from cdc_sync.job.settle.dead_letter import DeadLetter, DeadLetterWriter
from cdc_sync.job.settle.schema_changes import SchemaState, SchemaTracker
from cdc_sync.job.settle.schema_store import SchemaStore
from cdc_sync.job.settle.truncates import TruncateFences
from cdc_sync.job.write.generated import GeneratedColumns
from cdc_sync.job.write.table_writes import TableProgress, TableWrite, write_table
from cdc_sync.job.write.unavailable import SourceFiller
from cdc_sync.mapping import MappingFile, OnMalformed, OnTombstone, TableRoute, sink_section
from cdc_sync.schema import RowSchema
from cdc_sync.sinks.base import Sink, WriteResult

log = logging.getLogger(__name__)

# (table, sink) writes the driver runs at once: IO and Rust work, mostly off the GIL.
PARALLEL_COMMITS = 8


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


@dataclass
class BatchMetrics:
    batch_id: int
    consumer: str = "job"  # the consumer of the log that applied it (job.consumers)
    records: int = 0
    changes: int = 0
    compacted: int = 0
    tombstones: int = 0
    malformed: int = 0
    truncates: int = 0  # TRUNCATE records (job.settle.truncates)
    truncated: int = 0  # changes dropped as older than their table's TRUNCATE
    dead_lettered: int = 0
    documents: int = 0  # documents written (indexed or deleted) to document indices
    unavailable_gone: int = (
        0  # placeholders of rows deleted since: left out (job.write.unavailable)
    )
    ran_on: str = "executors"  # or "driver": where decode and writes ran (job.batch_phases)
    sinks: dict[str, WriteResult] = field(default_factory=dict)
    seconds: float = 0.0
    # Seconds per stage, so a slow stage shows without a profiler (job.stream sets the Spark
    # ones): decode (read + decode + fold, in tasks), write (the write tasks' wall time), fill
    # (Postgres reads of placeholders) and one entry per sink (summed over tasks; Delta on the
    # driver), dead_letter.
    stages: dict[str, float] = field(default_factory=dict)
    # Highest Kafka offset read per (topic, partition) in this batch (set by job.stream).
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    # Per routed table, what this batch applied (every sink acknowledged it when observers run).
    tables: dict[TableId, TableProgress] = field(default_factory=dict)
    # Per (routed table, sink name), what that sink did with the table's changes (`sinks` sums
    # these per sink): applied / fenced / failed per table and sink for metrics.
    table_sinks: dict[tuple[TableId, str], WriteResult] = field(default_factory=dict)
    # The highest `Change.commit_bound` among the batch's changes, heartbeats included: the
    # read-your-writes watermark's candidate (job.observe.watermark_rule says when it holds).
    commit_bound: int | None = None
    # The newest source commit time (ms) among the batch's changes, heartbeats included: an
    # idle job's lag (job.observe.console).
    source_ts_ms: int | None = None

    def timed(self, stage: str, started: float) -> None:
        self.stages[stage] = self.stages.get(stage, 0.0) + time.monotonic() - started

    def reconciles(self) -> bool:
        """Every record is accounted for, and every compacted change by every sink."""
        inputs_ok = self.records == self.changes + self.tombstones + self.malformed + self.truncates
        return inputs_ok and all(
            r.applied + r.fenced + len(r.failures) <= self.compacted for r in self.sinks.values()
        )

    def summary(self) -> str:
        per_sink = " ".join(
            f"{name}=applied:{r.applied},fenced:{r.fenced},failed:{len(r.failures)}"
            for name, r in self.sinks.items()
        )
        return (
            f"{self.consumer} batch {self.batch_id}: records={self.records} "
            f"changes={self.changes} "
            f"compacted={self.compacted} tombstones={self.tombstones} malformed={self.malformed} "
            f"truncates={self.truncates} truncated={self.truncated} "
            f"dead_lettered={self.dead_lettered} unavailable_gone={self.unavailable_gone} "
            f"documents={self.documents} "
            f"ran_on={self.ran_on} {per_sink} in {self.seconds:.2f}s "
            f"({' '.join(f'{name}:{took:.2f}s' for name, took in self.stages.items())})"
        )


BatchObserver = Callable[[BatchMetrics], None]


@dataclass
class BatchPlan:
    """What the driver settled before any write: rejected records handled, each routed table's
    schema accepted (and its targets evolved)."""

    metrics: BatchMetrics
    letters: list[DeadLetter]
    schemas: dict[TableId, SchemaState]  # per routed table of the batch
    started: float
    # Per routed table of the batch, its newest TRUNCATE so far: the writes drop older changes.
    fences: dict[TableId, TruncateFence] = field(default_factory=dict)
    # The batch's TRUNCATEs (and snapshot ends): the documents' state applies them too.
    truncates: Sequence[Truncate] = ()


class BatchApplier:
    """The driver's part of a batch: `begin` (policies, schemas, targets) before the writes and
    `finish` (once-per-batch sinks, failures, dead letters, observers) after them. `apply` runs
    the writes in process too (no Spark: tests, tools); `job.stream` runs them in executor
    tasks in between."""

    def __init__(
        self,
        mapping: MappingFile,
        sinks: Sequence[Sink],
        dead_letters: DeadLetterWriter | None,
        filler: SourceFiller | None = None,
        schema_store: SchemaStore | None = None,
        observers: Sequence[BatchObserver] = (),
        truncates: TruncateFences | None = None,
        documents: DocumentSync | None = None,
        generated: GeneratedColumns | None = None,
        consumer: str = "job",
    ) -> None:
        """`truncates`: the tables' TRUNCATE fences (kept beside the checkpoint by the job;
        without, in memory). `documents`: the document indices' step (mapping `documents`).
        `generated`: the tables' stored generated columns (`job.write.generated`). `consumer`: which
        consumer of the log this is (job.consumers): its batch lines and the dead letters of
        records it could not parse carry the name."""
        self.consumer = consumer
        self.mapping = mapping
        self.sinks = list(sinks)
        self.dead_letters = dead_letters
        self.filler = filler
        # Without a store the accepted schemas last as long as this applier (unit tests).
        self.schemas = SchemaTracker(mapping, schema_store, generated)
        self.truncates = truncates or TruncateFences()
        self.documents = documents
        self.history: list[BatchMetrics] = []
        # Called with each batch's metrics once every sink acknowledged it (before Spark commits
        # its offsets): metrics, watermarks (handed to their own thread), status. An observer
        # that raises fails the batch.
        self.observers: list[BatchObserver] = list(observers)
        # Kept across batches: a batch's own pool started and joined its threads every batch,
        # a tenth of a small batch's time on a busy driver (py-spy, 2026-11-28).
        self._committers = ThreadPoolExecutor(PARALLEL_COMMITS, "cdc-sync-commit")

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
        truncates: Sequence[Truncate] = (),
    ) -> BatchMetrics:
        """The whole batch in process. `tombstone_deletes`: tombstones applied as deletes
        (counted as tombstones; their deletes are among `compacted`); `stage_seconds`: the Spark
        stages' times; `offsets`: the highest offset read per (topic, partition); `truncates`:
        the batch's TRUNCATE records (counted among `records`)."""
        by_table: dict[TableId, list[Change]] = defaultdict(list)
        bounds = [c.commit_bound for c in compacted] + [t.commit_bound for t in truncates]
        for change, fingerprint in zip(compacted, schema_fps, strict=True):
            schema = schemas.get(fingerprint) if fingerprint else None
            by_table[change.table].append(_with_schema(change, schema))
        plan = self.begin(
            batch_id,
            records=records,
            changes=changes,
            compacted=len(compacted),
            rejected=rejected,
            table_schemas={table: newest_schema(found) for table, found in by_table.items()},
            tombstone_deletes=tombstone_deletes,
            stage_seconds=stage_seconds,
            offsets=offsets,
            commit_bound=max((b for b in bounds if b is not None), default=None),
            source_ts_ms=max(
                (t for t in (c.source_ts_ms for c in compacted) if t is not None), default=None
            ),
            truncates=truncates,
        )
        writes = [
            write_table(
                self.mapping.tables[table],
                state,
                by_table[table],
                self.sinks,
                self.filler,
                fence=plan.fences.get(table),
            )
            for table, state in sorted(plan.schemas.items())
        ]
        sink_seconds: dict[str, float] = defaultdict(float)
        for written in writes:
            for stage, took in written.seconds.items():
                sink_seconds[stage] += took
        return self.finish(plan, writes, sink_seconds)

    def begin(
        self,
        batch_id: int,
        *,
        records: int,
        changes: int,
        compacted: int,
        rejected: Sequence[Rejected],
        table_schemas: dict[TableId, RowSchema | None],
        tombstone_deletes: int = 0,
        stage_seconds: dict[str, float] | None = None,
        offsets: dict[tuple[str, int], int] | None = None,
        commit_bound: int | None = None,
        source_ts_ms: int | None = None,
        ran_on: str = "executors",
        truncates: Sequence[Truncate] = (),
    ) -> BatchPlan:
        """Before the writes: rejected records meet their policies, and each routed table's
        newest schema (`table_schemas`) meets `on_schema_change`; targets evolve here, on the
        driver, so no write runs against a target that lacks a column. Then each truncated
        table's sinks remove its rows older than the TRUNCATE (`job.settle.truncates`), before any
        of the batch's rows is written."""
        started = time.monotonic()
        metrics = BatchMetrics(
            batch_id,
            records=records,
            changes=changes,
            compacted=compacted,
            ran_on=ran_on,
            consumer=self.consumer,
        )
        metrics.stages.update(stage_seconds or {})
        metrics.offsets.update(offsets or {})
        metrics.commit_bound = commit_bound  # the batch's highest, heartbeats included
        metrics.source_ts_ms = source_ts_ms
        metrics.tombstones += tombstone_deletes
        letters = self._handle_rejected(rejected, metrics)
        accepted: dict[TableId, SchemaState] = {}
        for table, incoming in sorted(table_schemas.items()):
            route = self.mapping.route_for(table)
            if route is None:
                continue  # the heartbeat table (watermarks only), or a table not subscribed
            state = self.schemas.observe(route, incoming)
            if state.evolved:
                for sink in self.sinks:
                    sink.ensure_target(
                        route, route.sink_schema(sink_section(sink.name), state.schema)
                    )
                self.schemas.targets_ready(table)
            accepted[table] = state
        # A snapshot's end is a row's change too (counted there), not a record of its own.
        metrics.truncates = sum(1 for t in truncates if not t.snapshot_end)
        if truncates:
            truncate_started = time.monotonic()
            self.truncates.apply(self.mapping, self.sinks, truncates)
            metrics.timed("truncate", truncate_started)
        fences = {t: self.truncates.fences[t] for t in accepted if t in self.truncates.fences}
        return BatchPlan(metrics, letters, accepted, started, fences, list(truncates))

    def finish(
        self,
        plan: BatchPlan,
        writes: Sequence[TableWrite],
        write_seconds: dict[str, float],
        driver_sinks: Sequence[Sink] = (),
    ) -> BatchMetrics:
        """After the row sinks' writes (`writes`: per table, per partition): `driver_sinks`
        commit each table's deferred changes once; refused records meet `on_malformed`; dead
        letters are written; observers see the batch. `write_seconds`: per sink (and "fill"),
        how long the writes took."""
        metrics = plan.metrics
        metrics.stages.update(write_seconds)
        by_table: dict[TableId, list[TableWrite]] = defaultdict(list)
        for written in writes:
            by_table[written.table].append(written)
        letters = list(plan.letters)
        deferred = {
            table: {
                sink: [change for written in shares for change in written.deferred.get(sink, ())]
                for sink in {name for written in shares for name in written.deferred}
            }
            for table, shares in by_table.items()
        }
        committed = self._commit(driver_sinks, deferred, metrics)
        letters += self._documents(plan, deferred)
        for table, shares in sorted(by_table.items()):
            route = self.mapping.tables[table]
            results: dict[str, WriteResult] = {}
            for written in shares:
                metrics.unavailable_gone += written.gone
                metrics.truncated += written.truncated
                progress = metrics.tables.get(table, TableProgress())
                metrics.tables[table] = progress.combine(written.progress)
                for name, result in written.results.items():
                    results[name] = results.get(name, WriteResult()).merge(result)
            letters += self._refused(route, results)
            for sink in driver_sinks:
                result = committed[(table, sink.name)]
                letters += self._refused(route, {sink.name: result})
                results[sink.name] = result
            for name, result in results.items():
                metrics.sinks[name] = metrics.sinks.get(name, WriteResult()).merge(result)
                per_table = metrics.table_sinks.get((table, name), WriteResult())
                metrics.table_sinks[(table, name)] = per_table.merge(result)
        if letters:
            if self.dead_letters is None:
                raise PolicyViolation(
                    "records need dead-lettering but no dead-letter writer is set"
                )
            letters_started = time.monotonic()
            self.dead_letters.write(letters, metrics.batch_id)
            metrics.timed("dead_letter", letters_started)
        metrics.dead_lettered = len(letters)
        metrics.seconds = time.monotonic() - plan.started
        log.info("%s", metrics.summary())  # the detailed line: the log file, or the console with -v
        self.history.append(metrics)
        for observe in self.observers:
            observe(metrics)
        return metrics

    def _documents(
        self, plan: BatchPlan, deferred: dict[TableId, dict[str, list[Change]]]
    ) -> list[DeadLetter]:
        """The document indices, from the batch's full rows (after every sink's write: the
        flat sinks never wait for a document's fan-out)."""
        if self.documents is None:
            return []
        started = time.monotonic()
        changes = {table: found.get(DOCUMENTS_DEFERRED, []) for table, found in deferred.items()}
        result = self.documents.apply(
            plan.truncates, changes, plan.metrics.records, plan.metrics.batch_id
        )
        plan.metrics.timed("documents", started)
        plan.metrics.documents = result.rendered
        letters: list[DeadLetter] = []
        for name, failures in result.refused().items():
            route = self.mapping.tables[self.mapping.documents[name].table]
            letters += self._refused(route, {f"documents:{name}": failures})
        return letters

    def _commit(
        self,
        driver_sinks: Sequence[Sink],
        deferred: dict[TableId, dict[str, list[Change]]],
        metrics: BatchMetrics,
    ) -> dict[tuple[TableId, str], WriteResult]:
        """Each driver sink's write of each table (Delta: one commit per table and batch; for a
        batch run on the driver, search and cache too), all in parallel: distinct tables and
        sinks, network and Rust work mostly off the GIL, so the batch waits for the slowest
        rather than for their sum. A write that raises fails the batch once the others ended.
        Each sink's stage time is the longest of its tables."""
        jobs = [(table, sink) for table in sorted(deferred) for sink in driver_sinks]
        if not jobs:
            return {}
        routes = self.mapping.tables

        def timed(table: TableId, sink: Sink) -> tuple[WriteResult, float]:
            started = time.monotonic()
            changes = deferred[table].get(sink_section(sink.name), [])
            return sink.apply(routes[table], changes), time.monotonic() - started

        futures = {(t, sink.name): self._committers.submit(timed, t, sink) for t, sink in jobs}
        wait(futures.values())  # every write ends before the batch fails or goes on
        done = {key: future.result() for key, future in futures.items()}
        for (_, name), (_, took) in done.items():
            metrics.stages[name] = max(metrics.stages.get(name, 0.0), took)
        return {key: result for key, (result, _) in done.items()}

    def _refused(self, route: TableRoute, results: dict[str, WriteResult]) -> list[DeadLetter]:
        """Records the sinks refused: the batch fails under `on_malformed: fail`, else their
        dead letters."""
        letters: list[DeadLetter] = []
        for name, result in results.items():
            if result.failures and route.policies.on_malformed is OnMalformed.FAIL:
                first = result.failures[0]
                raise PolicyViolation(
                    f"{first.change.coordinates}: {name} refused {len(result.failures)} "
                    f"record(s) of {route.table} ({first.error_class}: {first.message}); set "
                    f"{self.mapping.setting_path(route.table, 'on_malformed')}: dead_letter "
                    "to dead-letter such records and keep going"
                )
            letters += [
                DeadLetter(
                    coordinates=failure.change.coordinates,
                    sink=name,
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
                if record.table is not None and record.table == self.mapping.heartbeat_table:
                    continue  # a deleted heartbeat row: nothing to apply anywhere
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
                    sink=self.consumer,  # each consumer skips the record: each says so
                    stage="parse",
                    error_class=record.error_class or "MalformedRecord",
                    message=f"{record.error_field}: {record.message}",
                    key=record.key,
                    value=record.value,
                )
            )
        return letters


def newest_schema(changes: Sequence[Change]) -> RowSchema | None:
    """Deletes carry no row schema: the newest change that has one tells the table's."""
    with_schema = [c for c in changes if c.schema is not None]
    return max(with_schema, key=lambda c: c.version).schema if with_schema else None


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
