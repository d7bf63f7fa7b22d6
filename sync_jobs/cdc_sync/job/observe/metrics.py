"""The sync job's Prometheus metrics.

Counters and the stage histogram are fed once per batch by `JobMetrics.observe` (a
`BatchApplier` observer: it runs after every sink acknowledged the batch). Everything that depends
on the clock or on other systems is computed at scrape time from state kept here: lag in seconds
(now - source commit time of the newest applied change), lag in records (the broker's end offset,
read in the background by `job.observe.capture_probes`, minus the processed offset), sink states
from `SinkHealth`, and the capture side (slot, connector). A scrape never waits on Kafka, Postgres
or Kafka Connect.

Labels are table, sink, stage, topic, partition, slot, probe and state names only: never row
values, keys or connection settings.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from cdc_sync.core.model import TableId
from cdc_sync.job.observe.capture_probes import CaptureReadings
from cdc_sync.job.settle.applier import BatchMetrics, TableProgress
from cdc_sync.job.write.health import SinkHealth, SinkState

# Batch stages run from milliseconds (a small fold) to minutes (a sink retried after an outage).
STAGE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
SINK_STATES = tuple(state.value for state in SinkState)
# Kafka Connect's connector and task states (Connect REST /connectors/<name>/status).
CONNECT_STATES = ("RUNNING", "PAUSED", "STOPPED", "FAILED", "UNASSIGNED", "RESTARTING")


class JobMetrics:
    """One job's metrics in a registry of its own (several jobs may share a process in tests)."""

    def __init__(
        self,
        health: SinkHealth | None = None,
        capture: Callable[[], CaptureReadings] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = CollectorRegistry()
        self._health = health
        self._capture = capture
        self._clock = clock
        self._lock = threading.Lock()
        # Per (consumer, table) and (consumer, topic, partition): each consumer of the log
        # (job.consumers) applies and commits on its own.
        self._watermarks: dict[tuple[str, TableId], TableProgress] = {}
        self._processed: dict[tuple[str, str, int], int] = {}
        counter = _counter_factory(self.registry)
        consumer = ["consumer"]
        self.batches = counter("cdc_sync_batches", "Micro-batches a consumer applied", consumer)
        self.records = counter("cdc_sync_records", "Kafka records read", consumer)
        self.tombstones = counter(
            "cdc_sync_tombstone_records", "Kafka tombstones (null values)", consumer
        )
        self.malformed = counter(
            "cdc_sync_malformed_records", "Records that could not be parsed", consumer
        )
        self.dead_lettered = counter(
            "cdc_sync_dead_lettered_records", "Records written to the dead-letter topic", consumer
        )
        self.changes = counter(
            "cdc_sync_table_changes",
            "Compacted changes applied, per consumer and table",
            ["consumer", "table"],
        )
        per_sink = ["table", "sink"]
        self.applied = counter("cdc_sync_sink_applied", "Changes a sink applied", per_sink)
        self.fenced = counter(
            "cdc_sync_sink_fenced", "Changes a sink refused as older than what it holds", per_sink
        )
        self.failed = counter(
            "cdc_sync_sink_failed", "Changes a sink refused for good (dead-lettered)", per_sink
        )
        self.stage_seconds = Histogram(
            "cdc_sync_batch_stage_seconds",
            "Seconds per batch stage (decode, fold, fill, one per sink, dead_letter)",
            ["consumer", "stage"],
            buckets=STAGE_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_ScrapeTime(self))

    def observer(self, consumer: str) -> Callable[[BatchMetrics], None]:
        """The `BatchApplier` observer of one consumer of the log (job.consumers)."""
        return lambda batch: self.observe(batch, consumer)

    def observe(self, batch: BatchMetrics, consumer: str) -> None:
        """Count what one consumer's batch did and advance its watermarks."""
        self.batches.labels(consumer).inc()
        self.records.labels(consumer).inc(batch.records)
        self.tombstones.labels(consumer).inc(batch.tombstones)
        self.malformed.labels(consumer).inc(batch.malformed)
        self.dead_lettered.labels(consumer).inc(batch.dead_lettered)
        for stage, seconds in batch.stages.items():
            self.stage_seconds.labels(consumer, stage).observe(seconds)
        for (table, sink), result in batch.table_sinks.items():
            self.applied.labels(str(table), sink).inc(result.applied)
            self.fenced.labels(str(table), sink).inc(result.fenced)
            self.failed.labels(str(table), sink).inc(len(result.failures))
        with self._lock:
            for table, progress in batch.tables.items():
                self.changes.labels(consumer, str(table)).inc(progress.changes)
                key = (consumer, table)
                self._watermarks[key] = _newest(self._watermarks.get(key), progress)
            for (topic, partition), offset in batch.offsets.items():
                where = (consumer, topic, partition)
                self._processed[where] = max(self._processed.get(where, -1), offset)

    def watermarks(self) -> dict[tuple[str, TableId], TableProgress]:
        with self._lock:
            return dict(self._watermarks)

    def processed_offsets(self) -> dict[tuple[str, str, int], int]:
        """Highest offset processed per (consumer, topic, partition) since the job started."""
        with self._lock:
            return dict(self._processed)

    def collect_scrape_time(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        now = self._clock()
        yield from _table_gauges(self.watermarks(), now)
        readings = self._capture() if self._capture is not None else None
        yield from _offset_gauges(
            self.processed_offsets(), readings.end_offsets if readings else None
        )
        if self._health is not None:
            yield from _sink_gauges(self._health)
        if readings is not None:
            yield from _capture_gauges(readings)


class _ScrapeTime(Collector):
    def __init__(self, metrics: JobMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        return self._metrics.collect_scrape_time()


def _counter_factory(registry: CollectorRegistry) -> Callable[..., Counter]:
    def make(name: str, documentation: str, labels: list[str] | None = None) -> Counter:
        return Counter(name, documentation, labels or [], registry=registry)

    return make


def _newest(held: TableProgress | None, batch: TableProgress) -> TableProgress:
    """The watermark never moves back (a re-run batch re-applies older changes)."""
    if held is None:
        return batch
    return TableProgress(
        held.changes + batch.changes,
        _max(held.max_version, batch.max_version),
        _max(held.max_source_ts_ms, batch.max_source_ts_ms),
    )


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _table_gauges(
    watermarks: dict[tuple[str, TableId], TableProgress], now: float
) -> Iterator[GaugeMetricFamily]:
    labels = ["consumer", "table"]
    version = GaugeMetricFamily(
        "cdc_sync_applied_version",
        "Highest change version (commit-order WAL position) the consumer applied",
        labels=labels,
    )
    commit_time = GaugeMetricFamily(
        "cdc_sync_applied_source_timestamp_seconds",
        "Highest source commit time the consumer applied (Unix seconds)",
        labels=labels,
    )
    lag = GaugeMetricFamily(
        "cdc_sync_lag_seconds",
        "Now minus the source commit time of the newest applied change (grows while idle)",
        labels=labels,
    )
    for (consumer, table), progress in sorted(watermarks.items()):
        names = [consumer, str(table)]
        if progress.max_version is not None:
            version.add_metric(names, progress.max_version)
        if progress.max_source_ts_ms is not None:
            committed = progress.max_source_ts_ms / 1000
            commit_time.add_metric(names, committed)
            lag.add_metric(names, max(0.0, now - committed))
    yield from (version, commit_time, lag)


def _offset_gauges(
    processed: dict[tuple[str, str, int], int], ends: dict[tuple[str, int], int] | None
) -> Iterator[GaugeMetricFamily]:
    labels = ["consumer", "topic", "partition"]
    done = GaugeMetricFamily(
        "cdc_sync_processed_offset", "Highest Kafka offset the consumer processed", labels=labels
    )
    end = GaugeMetricFamily(
        "cdc_sync_end_offset",
        "The broker's end offset (high watermark), sampled",
        labels=["topic", "partition"],
    )
    lag = GaugeMetricFamily(
        "cdc_sync_lag_records",
        "Records on the broker the consumer has not processed: end - (processed + 1)",
        labels=labels,
    )
    for (consumer, topic, partition), offset in sorted(processed.items()):
        done.add_metric([consumer, topic, str(partition)], offset)
        high = (ends or {}).get((topic, partition))
        if high is not None:
            lag.add_metric([consumer, topic, str(partition)], max(0, high - offset - 1))
    for (topic, partition), high in sorted((ends or {}).items()):
        end.add_metric([topic, str(partition)], high)
    yield from (done, end, lag)


def _sink_gauges(health: SinkHealth) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    state = GaugeMetricFamily(
        "cdc_sync_sink_state",
        "1 for the sink's current state (ok, waiting, failed)",
        labels=["sink", "state"],
    )
    attempts = GaugeMetricFamily(
        "cdc_sync_sink_failed_attempts",
        "Failed attempts of the write the sink is waiting on (0 when ok)",
        labels=["sink"],
    )
    retries = CounterMetricFamily(
        "cdc_sync_sink_retries", "Transient write failures retried since start", labels=["sink"]
    )
    statuses = health.status()
    for sink, status in sorted(statuses.items()):
        for name in SINK_STATES:
            state.add_metric([sink, name], 1.0 if status.state.value == name else 0.0)
        waiting = status.state is not SinkState.OK
        attempts.add_metric([sink], status.failures if waiting else 0)
    for sink, count in sorted(health.retries().items()):
        retries.add_metric([sink], count)
    yield from (state, attempts, retries)


def _capture_gauges(readings: CaptureReadings) -> Iterator[GaugeMetricFamily]:
    success = GaugeMetricFamily(
        "cdc_sync_probe_success",
        "1 when the latest background read succeeded (broker, slot, connector)",
        labels=["probe"],
    )
    for probe, ok in sorted(readings.succeeded.items()):
        success.add_metric([probe], 1.0 if ok else 0.0)
    yield success
    if readings.slots is not None:
        retained = GaugeMetricFamily(
            "cdc_sync_slot_retained_wal_bytes", "WAL the replication slot keeps", labels=["slot"]
        )
        behind = GaugeMetricFamily(
            "cdc_sync_slot_confirmed_lag_bytes",
            "WAL written since the slot's confirmed flush position",
            labels=["slot"],
        )
        active = GaugeMetricFamily(
            "cdc_sync_slot_active", "1 while a consumer streams from the slot", labels=["slot"]
        )
        for slot in readings.slots:
            if slot.retained_bytes is not None:
                retained.add_metric([slot.name], slot.retained_bytes)
            if slot.lag_bytes is not None:
                behind.add_metric([slot.name], slot.lag_bytes)
            active.add_metric([slot.name], 1.0 if slot.active else 0.0)
        yield from (retained, behind, active)
    if readings.connector is not None:
        connector = GaugeMetricFamily(
            "cdc_sync_connector_state",
            "1 for the Kafka Connect connector's current state",
            labels=["state"],
        )
        tasks = GaugeMetricFamily(
            "cdc_sync_connector_tasks", "The connector's tasks per state", labels=["state"]
        )
        for name in CONNECT_STATES:
            connector.add_metric([name], 1.0 if readings.connector.state == name else 0.0)
            tasks.add_metric([name], readings.connector.tasks.get(name, 0))
        yield from (connector, tasks)
