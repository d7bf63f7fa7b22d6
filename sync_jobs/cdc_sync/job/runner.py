"""Assemble and run the sync job: one Spark application, one streaming query per consumer of the
log (job.consumers: each sink, each document index), none waiting for another (invariant 8)."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence

import psycopg
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from cdc_sync.core.logs import CONSOLE
from cdc_sync.core.model import TableId
from cdc_sync.core.settings import Connections
from cdc_sync.debezium.database import SourceDatabase, source_database
from cdc_sync.job.consumer_job import ConsumerJob, SharedParts, converter_modes
from cdc_sync.job.consumers import Consumer, consumer_checkpoint, plan_consumers
from cdc_sync.job.observe.checkpoint import processed_offsets
from cdc_sync.job.observe.console import SnapshotProgress, catalog_estimates
from cdc_sync.job.observe.metrics_export import ConnectorStatus, MetricsEndpoint
from cdc_sync.job.options import (
    DEFAULT_DRIVER_BATCH_MAX_RECORDS,
    DEFAULT_MAX_OFFSETS_PER_TRIGGER,
    DEFAULT_TRIGGER_SECONDS,
    JobOptions,
)
from cdc_sync.job.settle.applier import BatchObserver
from cdc_sync.job.settle.shape_check import check_shapes
from cdc_sync.job.stale_checkpoints import refuse_stale_checkpoints
from cdc_sync.job.write.health import SinkHealth, SinkStatus
from cdc_sync.job.write.health_relay import HealthRelay
from cdc_sync.mapping import MappingFile
from cdc_sync.sinks.base import Sink

__all__ = [
    "DEFAULT_DRIVER_BATCH_MAX_RECORDS",
    "DEFAULT_MAX_OFFSETS_PER_TRIGGER",
    "DEFAULT_TRIGGER_SECONDS",
    "JobOptions",
    "QueryGroup",
    "SyncJob",
]

log = logging.getLogger(__name__)

POLL_SECONDS = 0.1  # how often a wait on the queries looks whether one ended
INITIALIZE_SECONDS = 60.0  # a query's sources start within this, or the next starts anyway
START_ATTEMPTS = 3  # starts of a query that fails before its first batch (QueryGroup)


class QueryGroup:
    """The consumers' streaming queries, handled as one: the job runs while all of them run; the
    first to fail (or stop) ends the job, and stopping stops them all.

    A query that fails before it made any progress is started again (`restart`), up to
    `START_ATTEMPTS` times: Spark gives the Python process of a query's source 10 s to connect
    back (a fixed limit), which a busy machine can miss while the other consumers run their first
    batches (seen in the e2e suite); nothing was applied yet, so a new start is harmless."""

    def __init__(
        self,
        queries: dict[str, StreamingQuery],
        restart: Callable[[str], StreamingQuery] | None = None,
    ) -> None:
        self.queries = queries
        self.restart = restart
        self.starts = dict.fromkeys(queries, 1)
        self._reviving = threading.Lock()

    def _revive(self) -> None:
        if self.restart is None:
            return
        with self._reviving:
            for name, query in list(self.queries.items()):
                if self.starts[name] >= START_ATTEMPTS or query.isActive:
                    continue
                error = query.exception()
                if error is None or query.lastProgress is not None:
                    continue
                first = str(error).strip().splitlines()[0] if str(error).strip() else ""
                logging.getLogger(CONSOLE).warning(
                    "consumer %s: its query failed before its first batch (%s); starting it again",
                    name,
                    first[:200],
                )
                self.starts[name] += 1
                self.queries[name] = self.restart(name)

    # StreamingQuery's names, so that callers handle one query or the group alike.
    @property
    def isActive(self) -> bool:
        self._revive()
        return all(query.isActive for query in self.queries.values())

    def awaitTermination(self, timeout: float | None = None) -> bool:
        """True once any query has ended (a failed one: `exception()` says why), else False
        after `timeout` seconds (None: wait for that)."""
        return self._wait(lambda: not self.isActive, timeout)

    def await_all(self, timeout: float) -> bool:
        """True once every query has ended (availableNow drains), else False after `timeout`."""

        def ended() -> bool:
            self._revive()
            return not any(query.isActive for query in self.queries.values())

        return self._wait(ended, timeout)

    @staticmethod
    def _wait(done: Callable[[], bool], timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(POLL_SECONDS)
        return True

    def exception(self) -> Exception | None:
        """The first failed consumer's error, named after the consumer."""
        self._revive()
        for name, query in self.queries.items():
            error = query.exception()
            if error is not None:
                return ConsumerFailed(name, error)
        return None

    def stop(self, timeout: float | None = None) -> bool:
        """Stop every query at once (each waits for its batch in progress); with `timeout`,
        wait that long at most. True when every query stopped."""
        stopping = [
            threading.Thread(target=query.stop, name=f"cdc-sync-stop-{name}", daemon=True)
            for name, query in self.queries.items()
        ]
        for thread in stopping:
            thread.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in stopping:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in stopping)


class ConsumerFailed(RuntimeError):
    def __init__(self, consumer: str, error: Exception) -> None:
        super().__init__(f"consumer {consumer}: {error}")
        self.consumer = consumer
        self.error = error


class SyncJob:
    def __init__(
        self,
        spark: SparkSession,
        mapping: MappingFile,
        connections: Connections,
        options: JobOptions,
        observers: Sequence[BatchObserver] = (),
        connector_status: ConnectorStatus | None = None,
        source: SourceDatabase | None = None,
    ) -> None:
        """`connector_status`: reads the Kafka Connect connector's status, for the metrics.
        `source`: the captured database, every Postgres read's (default: resolved here from the
        mapping's connector; refused before anything starts when CDC_SYNC_PG_URL names another).
        """
        self.spark = spark
        self.connections = connections
        self.options = options
        self.database = source or source_database(connections, mapping.connector)
        # Hash secrets read once here, carried to the tasks with the routes.
        mapping = self.mapping = check_shapes(mapping, self.database, converter_modes(mapping))
        planned = plan_consumers(mapping, options.checkpoint_dir, options.consumers)
        # Every sink's retries report here, executor tasks' through the relay: `sink_status()`
        # says which one a consumer waits for.
        self.health = SinkHealth()
        self.relay = HealthRelay(self.health, _driver_host(spark))
        self.metrics: MetricsEndpoint | None = None
        self.metrics_port: int | None = None  # the bound port once serving
        if options.metrics_port is not None:
            self.metrics = MetricsEndpoint(
                connections,
                mapping.topics(),
                self.health,
                connector_status,
                options.metrics_probe_seconds,
                self.database.conninfo,
            )
        self.progress = snapshot_progress(mapping, self.database, options, planned)
        shared = self.shared = SharedParts(
            spark,
            connections,
            options,
            self.database,
            self.health,
            self.relay,
            self.metrics.metrics if self.metrics is not None else None,
            self.progress,
            observers,
        )
        self.consumers = [ConsumerJob(consumer, shared) for consumer in planned]
        self.query: QueryGroup | None = None  # the running queries, once started

    def consumer(self, name: str) -> ConsumerJob:
        """The consumer named `name` (search, redis, delta, documents:<name>)."""
        for consumer in self.consumers:
            if consumer.name == name:
                return consumer
        raise KeyError(f"no consumer {name!r} (consumers: {[c.name for c in self.consumers]})")

    @property
    def sinks(self) -> list[Sink]:
        """Every consumer's sinks (the flat ones)."""
        return [sink for consumer in self.consumers for sink in consumer.sinks]

    def start(self, available_now: bool = False) -> QueryGroup:
        refuse_stale_checkpoints(
            [c.consumer for c in self.consumers],
            self.connections,
            self.options.checkpoint_dir,
            self.options.fail_on_data_loss,
        )
        if self.metrics is not None and self.metrics_port is None:
            port = self.options.metrics_port or 0
            self.metrics_port = self.metrics.serve(self.options.metrics_host, port)
        for consumer in self.consumers:
            consumer.ensure_targets()
        logging.getLogger(CONSOLE).info(
            "sync job started: %d tables, consumers %s, checkpoint %s",
            len(self.mapping.tables),
            ", ".join(c.name for c in self.consumers),
            self.options.checkpoint_dir,
        )
        if self.progress is not None:
            self.progress.start()

        def start(name: str) -> StreamingQuery:
            # One after the other: each query starts a Python process for its source (Python
            # Data Source), and Spark 4.2's factory of such processes is not safe for
            # concurrent starts: of four queries started at once, two or three failed with
            # "Python worker failed to connect back" (repeatable, on an idle machine too).
            query = self.consumer(name).start(available_now)
            _wait_initialized(query, INITIALIZE_SECONDS)
            return query

        try:
            started = {consumer.name: start(consumer.name) for consumer in self.consumers}
        finally:
            self.shared.all_started.set()  # the consumers' batches may run now
        self.query = QueryGroup(started, restart=start)
        return self.query

    def drain(self, timeout_seconds: float = 600) -> None:
        """Process everything in the topics now, then stop (trigger availableNow)."""
        group = self.start(available_now=True)
        if not group.await_all(timeout_seconds):
            group.stop()
            raise TimeoutError(f"sync job did not drain within {timeout_seconds}s")
        if group.exception() is not None:
            raise RuntimeError(f"sync job failed: {group.exception()}")

    def sink_status(self) -> dict[str, SinkStatus]:
        """Per sink: ok, waiting (since when, for which write), or failed."""
        return self.health.status()

    def close(self) -> None:
        for consumer in self.consumers:
            consumer.close()
        if self.metrics is not None:
            self.metrics.close()
        if self.progress is not None:
            self.progress.close()
        self.relay.close()


# StreamingQuery.status messages before its source's Python process surely runs: it is
# started while the sources initialize or at the first ask for offsets.
INITIALIZING = ("Initializing StreamExecution", "Initializing sources")
GETTING_OFFSETS = "Getting offsets"


def _wait_initialized(query: StreamingQuery, timeout: float) -> None:
    """Until the query has asked its source for offsets once (or ended, or `timeout` passed)."""
    deadline = time.monotonic() + timeout
    while query.isActive and time.monotonic() < deadline:
        message = str(query.status.get("message", ""))
        if message not in INITIALIZING and not message.startswith(GETTING_OFFSETS):
            return
        if query.lastProgress is not None:
            return
        time.sleep(POLL_SECONDS)


def _driver_host(spark: SparkSession) -> str:
    """Where executors reach the driver (loopback in local mode, see `spark_session`)."""
    return spark.conf.get("spark.driver.host", None) or "127.0.0.1"


def snapshot_progress(
    mapping: MappingFile,
    source: SourceDatabase,
    options: JobOptions,
    consumers: Sequence[Consumer],
) -> SnapshotProgress | None:
    """The snapshot progress view when wanted (default: stdout is a terminal); it opens at start
    on fresh checkpoints, where the initial load is coming."""
    wanted = sys.stdout.isatty() if options.snapshot_progress is None else options.snapshot_progress
    if not wanted:
        return None
    with psycopg.connect(source.conninfo) as conn:
        estimates = catalog_estimates(conn, list(mapping.tables))
    consumers_of: dict[TableId, set[str]] = {}
    for consumer in consumers:
        for table in consumer.tables():
            consumers_of.setdefault(table, set()).add(consumer.name)
    fresh = all(
        processed_offsets(consumer_checkpoint(options.checkpoint_dir, c.name)) is None
        for c in consumers
    )
    return SnapshotProgress(estimates, fresh, consumers_of=consumers_of)
