"""Assemble and run the sync job: mapping + connections -> sinks -> streaming query."""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from cdc_sync.core.errors import ConfigError
from cdc_sync.core.logs import CONSOLE
from cdc_sync.core.model import KnownSchemas, TableId
from cdc_sync.core.retry import (
    DEFAULT_ATTEMPT_TIMEOUT_SECONDS,
    DEFAULT_HORIZON_SECONDS,
    RetryObserver,
    RetryPolicy,
)
from cdc_sync.core.settings import Connections, state_dir
from cdc_sync.debezium.connector import converter_modes as connector_modes
from cdc_sync.debezium.database import SourceDatabase, source_database
from cdc_sync.documents import DocumentSync
from cdc_sync.documents.comparisons import TableTypes, catalog_types
from cdc_sync.job.applier import BatchApplier, BatchObserver
from cdc_sync.job.batch_phases import SmallBatches
from cdc_sync.job.checkpoint import default_checkpoint_dir, processed_offsets
from cdc_sync.job.console import BatchLine, SnapshotProgress, catalog_estimates
from cdc_sync.job.dead_letter import DeadLetterLedger, DeadLetterWriter
from cdc_sync.job.health import SinkHealth, SinkStatus
from cdc_sync.job.health_relay import HealthRelay
from cdc_sync.job.metrics_export import (
    DEFAULT_METRICS_HOST,
    DEFAULT_PROBE_SECONDS,
    ConnectorStatus,
    MetricsEndpoint,
)
from cdc_sync.job.open_transactions import FileOpenTransactions
from cdc_sync.job.query_progress import log_previous_batch
from cdc_sync.job.schema_store import FileSchemaStore
from cdc_sync.job.shape_check import check_shapes
from cdc_sync.job.status_file import StatusRecorder
from cdc_sync.job.stream import MicroBatchProcessor
from cdc_sync.job.task_sinks import TaskSinkSpec
from cdc_sync.job.truncates import FileTruncateFences, TruncateFences
from cdc_sync.job.version_floors import FileVersionFloors
from cdc_sync.job.watermarks import WatermarkObserver
from cdc_sync.mapping import MappingFile, SchemaSource
from cdc_sync.schema import RowSchema
from cdc_sync.schema.catalog import ConverterModes, known_schemas, row_schema_from_catalog
from cdc_sync.sinks.base import Sink
from cdc_sync.sinks.delta import DeltaSink
from cdc_sync.sinks.delta.maintenance import EveryNBatches, UpkeepOptions, maintain_route
from cdc_sync.sinks.delta.spark_client import DeltaSparkWriter, delta_spark_available
from cdc_sync.sinks.search import SearchSink
from cdc_sync.source import stream_options, stream_with_options
from cdc_sync.source.end_offsets import EndOffsets
from cdc_sync.source.options import parse_options

log = logging.getLogger(__name__)

# Records per micro-batch at most: after an outage one batch would otherwise hold the whole
# backlog in memory (83,772 records were seen in one). ~20k keeps a batch within seconds.
DEFAULT_MAX_OFFSETS_PER_TRIGGER = 20_000
DEFAULT_TRIGGER_SECONDS = 0.25
# Up to here a batch is written faster by the driver alone than by two Spark jobs on this
# build machine (`make bench`); streaming at hundreds of changes a second stays below it.
DEFAULT_DRIVER_BATCH_MAX_RECORDS = 2_000


@dataclass(frozen=True)
class JobOptions:
    checkpoint_dir: Path
    warehouse: Path
    # A micro-batch starts this often at most (back to back when one takes longer); a change
    # waits half of it on average before its batch starts. An idle trigger asks the broker for
    # its end offsets, a few milliseconds.
    trigger_seconds: float = DEFAULT_TRIGGER_SECONDS
    max_offsets_per_trigger: int | None = DEFAULT_MAX_OFFSETS_PER_TRIGGER  # None: unbounded
    # Checkpoint offsets the broker no longer has (topic re-created, retention): fail (default)
    # or warn and continue from the partition's low watermark. The source's failOnDataLoss.
    fail_on_data_loss: bool = True
    query_name: str | None = None  # default cdc-sync-<mapping>; unique among active queries
    # A sink that fails transiently (down, frozen, 5xx/429) is retried this long from the
    # write's first failure before the batch fails, which ends the streaming query.
    sink_retry_horizon_seconds: float = DEFAULT_HORIZON_SECONDS
    # Each request to a sink gives up after this long (a hung server fails the attempt).
    sink_request_timeout_seconds: float = DEFAULT_ATTEMPT_TIMEOUT_SECONDS
    # Prometheus metrics on http://<metrics_host>:<metrics_port>/metrics; None: off, 0: any port.
    metrics_port: int | None = None
    metrics_host: str = DEFAULT_METRICS_HOST
    # How often the broker's end offsets, the slot and the connector are read for the metrics.
    metrics_probe_seconds: float = DEFAULT_PROBE_SECONDS
    # The initial snapshot's live progress view; None: when stdout is a terminal.
    snapshot_progress: bool | None = None
    # Delta upkeep (compact, vacuum, prune tombstones) after every N-th batch; None: off.
    maintain_every_batches: int | None = None
    # Batches of at most this many records run on the driver, without Spark jobs (a Spark
    # job's fixed cost dominates a small batch: job.batch_phases); 0: always on the executors.
    driver_batch_max_records: int = DEFAULT_DRIVER_BATCH_MAX_RECORDS

    def sink_retry(self, observer: RetryObserver | None = None) -> RetryPolicy:
        """The retry policy every sink writes under, reporting to `observer`."""
        return RetryPolicy(
            horizon_seconds=self.sink_retry_horizon_seconds,
            attempt_timeout_seconds=self.sink_request_timeout_seconds,
            observer=observer,
        )

    @classmethod
    def defaults(cls, mapping: MappingFile, connections: Connections) -> JobOptions:
        root = state_dir()
        return cls(
            checkpoint_dir=default_checkpoint_dir(mapping.path),
            warehouse=Path(connections.warehouse) if connections.warehouse else root / "warehouse",
        )


def source_options(
    options: JobOptions, *, bootstrap: str, flavor: str, topics: list[str]
) -> dict[str, str]:
    """The Kafka source's options: bounded per micro-batch and checked for data loss as
    ``options`` say. The stream and the driver's small-batch reader share them."""
    return stream_options(
        bootstrap=bootstrap,
        flavor=flavor,
        topics=topics,
        max_offsets_per_trigger=options.max_offsets_per_trigger,
        fail_on_data_loss=options.fail_on_data_loss,
    )


def job_stream(
    spark: SparkSession, options: JobOptions, *, bootstrap: str, flavor: str, topics: list[str]
) -> DataFrame:
    """The Kafka stream the job reads."""
    where = source_options(options, bootstrap=bootstrap, flavor=flavor, topics=topics)
    return stream_with_options(spark, where)


def small_batches(options: JobOptions, source: dict[str, str]) -> SmallBatches | None:
    """The driver's reader for small batches (None when every batch runs on the executors)."""
    if options.driver_batch_max_records <= 0:
        return None
    return SmallBatches(
        parse_options(source), options.checkpoint_dir, options.driver_batch_max_records
    )


def build_delta_sink(
    mapping: MappingFile, warehouse: Path, spark: SparkSession, retry: RetryPolicy
) -> Sink | None:
    """The warehouse sink, if the mapping routes to it: it commits on the driver, once per
    table and batch (delta-spark MERGE where its jars are present, else deltalake)."""
    if not any(r.delta for r in mapping.tables.values()):
        return None
    retention = mapping.tombstone_retention_seconds
    writer = DeltaSparkWriter(spark, warehouse, retention) if delta_spark_available(spark) else None
    log.info("Delta writes through %s", "delta-spark" if writer else "deltalake (delta-rs)")
    return DeltaSink(warehouse, retention, writer, retry)


# The route section each sink writes from (sink name -> `TableRoute` attribute).
ROUTE_SECTIONS = {"search": "search", "redis": "cache", "delta": "delta"}


def sink_tables(mapping: MappingFile, sinks: Sequence[Sink]) -> dict[str, list[TableId]]:
    """Per sink, the routed tables it writes."""
    return {
        sink.name: sorted(
            table
            for table, route in mapping.tables.items()
            if getattr(route, ROUTE_SECTIONS.get(sink.name, sink.name), None) is not None
        )
        for sink in sinks
    }


def catalog_schemas(mapping: MappingFile, source: SourceDatabase) -> KnownSchemas | None:
    """With `source.schemas: catalog`, the routed tables' schemas, read once from the captured
    database, as the mapping's connector encodes them (its decimal/binary/time modes)."""
    if mapping.schema_source is not SchemaSource.CATALOG:
        return None
    with psycopg.connect(source.conninfo) as conn:
        # The heartbeat table's records are parsed too (watermarks), so it needs a schema.
        return known_schemas(conn, mapping.read_tables(), converter_modes(mapping))


def _driver_host(spark: SparkSession) -> str:
    """Where executors reach the driver (loopback in local mode, see `spark_session`)."""
    return spark.conf.get("spark.driver.host", None) or "127.0.0.1"


def converter_modes(mapping: MappingFile) -> ConverterModes:
    """How the mapping's connector encodes values (Debezium's defaults without a connector)."""
    return connector_modes(mapping.connector)


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
        self.mapping = mapping
        self.connections = connections
        self.options = options
        self.database = source or source_database(connections, mapping.connector)
        # Hash secrets read once here, carried to the tasks with the routes.
        mapping = self.mapping = check_shapes(mapping, self.database, converter_modes(mapping))
        # Every sink's retries report here, executor tasks' through the relay: `sink_status()`
        # says which one the job waits for.
        self.health = SinkHealth()
        self.source = source_options(
            options,
            bootstrap=connections.require("kafka_bootstrap"),
            flavor=connections.kafka_flavor,
            topics=mapping.topics(),
        )
        self.relay = HealthRelay(self.health, _driver_host(spark))
        retry = options.sink_retry(self.health)
        modes = converter_modes(mapping)
        spec = dataclasses.replace(
            TaskSinkSpec.for_job(mapping, connections, retry, modes, self.database.conninfo),
            relay=self.relay.address,
        )
        delta = build_delta_sink(mapping, options.warehouse, spark, retry)
        self.driver_sinks: list[Sink] = [delta] if delta is not None else []
        # The driver's own row sinks: target set-up (`ensure_target`) and tools; tasks write.
        self.sinks = spec.open_sinks(self.health) + self.driver_sinks
        self.health.track(sink.name for sink in self.sinks)
        self.dead_letters = DeadLetterWriter(
            connections.require("kafka_bootstrap"),
            connections.kafka_flavor,
            mapping.dead_letter_topic,
            DeadLetterLedger.beside_checkpoint(options.checkpoint_dir),  # once per batch
        )
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
            observers = [*observers, self.metrics.metrics.observe]
        # `cdc-sync status` reads what this writes beside the checkpoint, after every batch.
        self.status = StatusRecorder(
            options.checkpoint_dir,
            mapping.path.stem,
            sink_tables(mapping, self.sinks),
            self.health,
        )
        # Read-your-writes: the applied watermark, recorded in every sink after each batch, on
        # its own thread (the next batch does not wait for it).
        self.watermarks = WatermarkObserver(
            mapping,
            self.sinks,
            EndOffsets(connections.require("kafka_bootstrap"), connections.kafka_flavor),
            options.checkpoint_dir,
        )
        self.progress = snapshot_progress(mapping, self.database, options)
        # The progress view first: its summary line precedes the batch line that ended it.
        batch_lines = BatchLine(lambda: self.watermarks.watermark)
        console = ([self.progress] if self.progress else []) + [batch_lines]
        self.documents = build_documents(
            mapping, self.sinks, options.checkpoint_dir, options.max_offsets_per_trigger
        )
        # The accepted schemas belong to this query's checkpoint: a new checkpoint, a new baseline.
        self.applier = BatchApplier(
            mapping,
            self.sinks,
            self.dead_letters,
            None,  # the TOAST fill runs in the write tasks (spec.source_conninfo)
            FileSchemaStore.beside_checkpoint(options.checkpoint_dir),
            [self.watermarks, *observers, self.status, *console],
            TruncateFences(FileTruncateFences.beside_checkpoint(options.checkpoint_dir)),
            self.documents,
        )
        self.processor = MicroBatchProcessor(
            self.applier,
            spec,
            self.driver_sinks,
            catalog_schemas(mapping, self.database),
            FileVersionFloors.beside_checkpoint(options.checkpoint_dir),
            small_batches(options, self.source),
            FileOpenTransactions.beside_checkpoint(options.checkpoint_dir),
        )
        every = options.maintain_every_batches
        self.upkeep = EveryNBatches(every, self.maintain) if every else None
        self.query: StreamingQuery | None = None  # the running query, once started

    def start(self, available_now: bool = False) -> StreamingQuery:
        if self.metrics is not None and self.metrics_port is None:
            port = self.options.metrics_port or 0
            self.metrics_port = self.metrics.serve(self.options.metrics_host, port)
        for route in self.mapping.tables.values():
            for sink in self.sinks:
                sink.ensure_target(route, None)
        if self.documents is not None:
            self.documents.ensure_targets(
                document_schemas(self.mapping, self.database, converter_modes(self.mapping)),
                document_types(self.mapping, self.database),
            )
        stream = stream_with_options(self.spark, self.source)
        writer = (
            stream.writeStream.queryName(
                self.options.query_name or f"cdc-sync-{self.mapping.path.stem}"
            )
            .foreachBatch(self._batch)
            .option("checkpointLocation", str(self.options.checkpoint_dir))
        )
        if available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{self.options.trigger_seconds} seconds")
        logging.getLogger(CONSOLE).info(
            "sync job started: %d tables, checkpoint %s",
            len(self.mapping.tables),
            self.options.checkpoint_dir,
        )
        if self.progress is not None:
            self.progress.start()
        query = self.query = writer.start()
        self.status.start_heartbeat(lambda: query_state(query))
        return query

    def _batch(self, batch: DataFrame, batch_id: int) -> None:
        # Spark's phases of the previous batch (offsets, planning, logs) beside the batch lines.
        log_previous_batch(self.query, batch_id)
        self.processor(batch, batch_id)
        if self.upkeep is not None:  # between batches: never beside this job's own MERGE
            self.upkeep.after_batch()

    def maintain(self) -> None:
        """Delta upkeep of every routed table, with the default vacuum retention."""
        options = UpkeepOptions(self.mapping.tombstone_retention_seconds)
        for route in self.mapping.tables.values():
            if route.delta is not None:
                maintain_route(self.options.warehouse, route.delta, options)

    def drain(self, timeout_seconds: float = 600) -> None:
        """Process everything in the topics now, then stop (trigger availableNow)."""
        query = self.start(available_now=True)
        query.awaitTermination(int(timeout_seconds))
        if query.isActive:
            query.stop()
            raise TimeoutError(f"sync job did not drain within {timeout_seconds}s")
        if query.exception() is not None:
            raise RuntimeError(f"sync job failed: {query.exception()}")

    def sink_status(self) -> dict[str, SinkStatus]:
        """Per sink: ok, waiting (since when, for which write), or failed."""
        return self.health.status()

    def close(self) -> None:
        self.watermarks.close()  # first: it records the last watermark through the sinks
        if self.metrics is not None:
            self.metrics.close()
        if self.progress is not None:
            self.progress.close()
        self.status.close()
        for sink in self.sinks:
            sink.close()
        self.dead_letters.close()
        self.relay.close()
        if self.documents is not None:
            self.documents.close()


def build_documents(
    mapping: MappingFile, sinks: Sequence[Sink], checkpoint: Path, full_batch: int | None
) -> DocumentSync | None:
    """The document indices' step (mapping `documents`), writing through the search sink."""
    if not mapping.documents:
        return None
    search = next((sink for sink in sinks if isinstance(sink, SearchSink)), None)
    if search is None:
        names = ", ".join(sorted(mapping.documents))
        raise ConfigError(
            mapping.path, "documents", f"{names} need a search server: set CDC_SYNC_SEARCH_URL"
        )
    return DocumentSync.beside_checkpoint(mapping, checkpoint, search, full_batch)


def document_schemas(
    mapping: MappingFile, source: SourceDatabase, modes: ConverterModes
) -> dict[TableId, RowSchema]:
    """The document tables' schemas from the catalog: the indices' field types."""
    tables = sorted({t for spec in mapping.documents.values() for t in spec.tables()})
    with psycopg.connect(source.conninfo) as conn:
        return {table: row_schema_from_catalog(conn, table, modes) for table in tables}


def document_types(mapping: MappingFile, source: SourceDatabase) -> dict[TableId, TableTypes]:
    """The document tables' Postgres column types and keys: how their rows join and sort."""
    tables = sorted({t for spec in mapping.documents.values() for t in spec.tables()})
    with psycopg.connect(source.conninfo) as conn:
        return catalog_types(conn, tables)


def snapshot_progress(
    mapping: MappingFile, source: SourceDatabase, options: JobOptions
) -> SnapshotProgress | None:
    """The snapshot progress view when wanted (default: stdout is a terminal); it opens at start
    on a fresh checkpoint, where the initial load is coming."""
    wanted = sys.stdout.isatty() if options.snapshot_progress is None else options.snapshot_progress
    if not wanted:
        return None
    with psycopg.connect(source.conninfo) as conn:
        estimates = catalog_estimates(conn, list(mapping.tables))
    return SnapshotProgress(estimates, processed_offsets(options.checkpoint_dir) is None)


def query_state(query: StreamingQuery) -> tuple[str, str | None]:
    """running | stopped | failed, and the failure's class and first line."""
    if query.isActive:
        return "running", None
    error = query.exception()
    if error is None:
        return "stopped", None
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return "failed", f"{type(error).__name__}: {first}"[:300]
