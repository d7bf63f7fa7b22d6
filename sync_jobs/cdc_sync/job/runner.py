"""Assemble and run the sync job: one Spark application, one streaming query per consumer of the
log (job.consumers: each sink, each document index), none waiting for another (invariant 8)."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence

import psycopg
from py4j.protocol import Py4JError
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
# Seconds before the 1st, 2nd, ... restart of a consumer whose query failed for a reason that may
# pass; as many restarts within RESTART_WINDOW_SECONDS at most, then its failure ends the job.
RESTART_DELAYS = (1.0, 5.0, 15.0, 30.0, 60.0)
RESTART_WINDOW_SECONDS = 3600.0


class QueryGroup:
    """The consumers' streaming queries, handled as one: the job runs while all of them run, and
    stopping stops them all.

    A consumer's query that fails for a reason that may pass (`terminal(name)` false: a sink
    down past the retry horizon, the broker, a Python process of Spark's that did not come up
    in time) is started again on its checkpoint after a delay (`RESTART_DELAYS`), the other
    consumers running meanwhile (invariant 8): its batch re-runs, and every write is fenced.
    A failure that will not pass (a policy that says fail, a refused schema change, a corrupt
    file) or one that keeps coming back ends the job: `exception()` says which."""

    def __init__(
        self,
        queries: dict[str, StreamingQuery],
        restart: Callable[[str], StreamingQuery] | None = None,
        terminal: Callable[[str], bool] = lambda name: False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.queries = queries
        self.restart = restart
        self.terminal = terminal
        self.clock = clock
        self.restarted: dict[str, list[float]] = {name: [] for name in queries}
        self.due: dict[str, float] = {}  # consumer -> when its next start is due
        self._reviving = threading.Lock()
        self.stopped = False  # once stopped, nothing starts again

    def _recent(self, name: str) -> list[float]:
        now = self.clock()
        return [t for t in self.restarted[name] if now - t < RESTART_WINDOW_SECONDS]

    def _waits_for_restart(self, name: str) -> bool:
        """Failed, for a reason that may pass, with restarts left."""
        query = self.queries[name]
        if self.stopped or self.restart is None or query.isActive or query.exception() is None:
            return False
        return not self.terminal(name) and len(self._recent(name)) < len(RESTART_DELAYS)

    def _revive(self) -> None:
        with self._reviving:
            for name in list(self.queries):
                if not self._waits_for_restart(name):
                    self.due.pop(name, None)
                    continue
                recent = self._recent(name)
                due = self.due.setdefault(name, self.clock() + RESTART_DELAYS[len(recent)])
                if self.clock() < due:
                    continue
                error = str(self.queries[name].exception() or "").strip()
                logging.getLogger(CONSOLE).warning(
                    "consumer %s: its query failed (%s); starting it again on its checkpoint "
                    "(restart %d of at most %d within %.0f min)",
                    name,
                    error.splitlines()[0][:200] if error else "",
                    len(recent) + 1,
                    len(RESTART_DELAYS),
                    RESTART_WINDOW_SECONDS / 60,
                )
                del self.due[name]
                self.restarted[name] = [*recent, self.clock()]
                assert self.restart is not None
                self.queries[name] = self.restart(name)

    # StreamingQuery's names, so that callers handle one query or the group alike.
    @property
    def isActive(self) -> bool:
        """Every consumer runs, or waits to be started again."""
        self._revive()
        return all(
            query.isActive or self._waits_for_restart(name) for name, query in self.queries.items()
        )

    def awaitTermination(self, timeout: float | None = None) -> bool:
        """True once any query has ended (a failed one: `exception()` says why), else False
        after `timeout` seconds (None: wait for that)."""
        return self._wait(lambda: not self.isActive, timeout)

    def await_all(self, timeout: float) -> bool:
        """True once every query has ended (availableNow drains), else False after `timeout`."""

        def ended() -> bool:
            self._revive()
            return not any(
                query.isActive or self._waits_for_restart(name)
                for name, query in self.queries.items()
            )

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
        """The first consumer's error that ended the job, named after the consumer."""
        self._revive()
        for name, query in self.queries.items():
            error = query.exception()
            if error is not None and not self._waits_for_restart(name):
                return ConsumerFailed(name, error)
        return None

    def stop(self, timeout: float | None = None) -> bool:
        """Stop every query at once (each waits for its batch in progress); with `timeout`,
        wait that long at most. True when every query stopped."""
        with self._reviving:  # a restart under way ends first, and none follows
            self.stopped = True
        stopping = [
            threading.Thread(target=_stop, args=(name, query), name=f"cdc-sync-stop-{name}")
            for name, query in self.queries.items()
        ]
        for thread in stopping:
            thread.daemon = True
        for thread in stopping:
            thread.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in stopping:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in stopping)


def _stop(name: str, query: StreamingQuery) -> None:
    try:
        query.stop()
    except (Py4JError, ConnectionError) as error:  # the JVM ended first (a signal to the group)
        log.debug("consumer %s: its query could not be stopped: %s", name, error)


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

    def _failed_for_good(self, name: str) -> bool:
        return self.consumer(name).failed_for_good()

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
        self.query = QueryGroup(started, restart=start, terminal=self._failed_for_good)
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
