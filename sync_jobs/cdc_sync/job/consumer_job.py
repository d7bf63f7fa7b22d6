"""One consumer of the log (job.consumers) assembled: its sinks, its streaming query, and all it
keeps beside its own checkpoint (floors, open transactions, truncate fences, accepted schemas,
dead-letter ledger, status file, watermarks, a document index's state).

What consumers share is passed in (`SharedParts`): the Spark session, the captured database,
sink health (with its relay for executor tasks), the metrics endpoint and the snapshot view:
all of them observe, none of them holds a batch.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import shutil
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from confluent_kafka import KafkaException
from pyspark.errors import PythonException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from cdc_sync.core.errors import ConfigError
from cdc_sync.core.logs import CONSOLE
from cdc_sync.core.model import KnownSchemas, TableId
from cdc_sync.core.retry import RetryPolicy, TransientSinkError
from cdc_sync.core.settings import Connections
from cdc_sync.debezium.connector import converter_modes as connector_modes
from cdc_sync.debezium.database import SourceDatabase
from cdc_sync.documents import DocumentSync, state_fits_checkpoint
from cdc_sync.documents.comparisons import TableTypes, catalog_types
from cdc_sync.documents.sync import STATE_FILE
from cdc_sync.job.batch_phases import SmallBatches
from cdc_sync.job.consumers import Consumer
from cdc_sync.job.decode.open_transactions import FileOpenTransactions
from cdc_sync.job.decode.version_floors import FileVersionFloors
from cdc_sync.job.observe.console import BatchLine, SnapshotProgress
from cdc_sync.job.observe.metrics import JobMetrics
from cdc_sync.job.observe.query_progress import log_previous_batch
from cdc_sync.job.observe.status_file import StatusRecorder
from cdc_sync.job.observe.watermarks import WatermarkObserver
from cdc_sync.job.options import JobOptions
from cdc_sync.job.settle.applier import BatchApplier, BatchObserver
from cdc_sync.job.settle.dead_letter import DeadLetterLedger, DeadLetterWriter
from cdc_sync.job.settle.schema_store import FileSchemaStore
from cdc_sync.job.settle.truncates import FileTruncateFences, TruncateFences
from cdc_sync.job.stopping import raise_for_spark
from cdc_sync.job.stream import MicroBatchProcessor
from cdc_sync.job.write.generated import GeneratedColumns
from cdc_sync.job.write.health import SinkHealth
from cdc_sync.job.write.health_relay import HealthRelay
from cdc_sync.job.write.task_sinks import TaskSinkSpec, release_task_sinks
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
from cdc_sync.source.python_kafka import KafkaRangeUnreachable

log = logging.getLogger(__name__)


@dataclass
class SharedParts:
    """What the application's consumers share: observers and read-only settings only."""

    spark: SparkSession
    connections: Connections
    options: JobOptions
    database: SourceDatabase
    health: SinkHealth
    relay: HealthRelay
    metrics: JobMetrics | None = None
    progress: SnapshotProgress | None = None
    observers: Sequence[BatchObserver] = ()
    # Set once every consumer's query has started: a batch waits for it, so that no consumer's
    # first (large) batch takes the CPU from a later consumer's start (its source's Python
    # process must connect back to Spark within 10 s, a fixed limit of Spark's).
    all_started: threading.Event = field(default_factory=threading.Event)


# Failures of a batch that starting its query again may overcome: a sink or the broker that did
# not answer within the retry horizon (job.runner.QueryGroup restarts the query).
PASSING_FAILURES: tuple[type[BaseException], ...] = (
    TransientSinkError,
    KafkaException,
    KafkaRangeUnreachable,
)


# A traceback's "module.Type: message" lines (the last one names what was raised).
RAISED = re.compile(r"^([A-Za-z_][\w.]*): ", re.MULTILINE)


def may_pass(error: BaseException) -> bool:
    """A failure in `PASSING_FAILURES`, raised here or in a Spark task: a task's error reaches
    the driver as Spark's PythonException, its type named only in the task's traceback (seen on
    a busy broker: a read that timed out in an executor task ended the job)."""
    if isinstance(error, PASSING_FAILURES):
        return True
    if not isinstance(error, PythonException):
        return False
    raised = RAISED.findall(str(error))
    return bool(raised) and raised[-1].rsplit(".", 1)[-1] in {k.__name__ for k in PASSING_FAILURES}


def converter_modes(mapping: MappingFile) -> ConverterModes:
    """How the mapping's connector encodes values (Debezium's defaults without a connector)."""
    return connector_modes(mapping.connector)


def source_options(
    options: JobOptions,
    *,
    bootstrap: str,
    flavor: str,
    topics: list[str],
    oldest_first: bool = False,
    log_relay: tuple[str, int] | None = None,
) -> dict[str, str]:
    """The Kafka source's options: bounded per micro-batch and checked for data loss as
    ``options`` say. The stream and the driver's small-batch reader share them. `oldest_first`:
    a backlog is read in the log's time order (a document consumer's: see `ConsumerJob`).
    `log_relay`: the job's task relay, where the source's worker processes log."""
    return stream_options(
        bootstrap=bootstrap,
        flavor=flavor,
        topics=topics,
        max_offsets_per_trigger=options.max_offsets_per_trigger,
        fail_on_data_loss=options.fail_on_data_loss,
        backlog_order="time" if oldest_first else None,
        log_relay=log_relay,
    )


def job_stream(
    spark: SparkSession,
    options: JobOptions,
    *,
    bootstrap: str,
    flavor: str,
    topics: list[str],
    log_relay: tuple[str, int] | None = None,
) -> DataFrame:
    """The Kafka stream a consumer reads."""
    where = source_options(
        options, bootstrap=bootstrap, flavor=flavor, topics=topics, log_relay=log_relay
    )
    return stream_with_options(spark, where)


def small_batches(
    options: JobOptions, source: dict[str, str], checkpoint_dir: Path
) -> SmallBatches | None:
    """The driver's reader for small batches (None when every batch runs on the executors)."""
    if options.driver_batch_max_records <= 0:
        return None
    return SmallBatches(parse_options(source), checkpoint_dir, options.driver_batch_max_records)


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


def sink_tables(mapping: MappingFile, sinks: Sequence[Sink]) -> dict[str, list[TableId]]:
    """Per sink, the routed tables it writes (a consumer's mapping routes only its own)."""
    return {sink.name: sorted(mapping.tables) for sink in sinks}


def catalog_schemas(mapping: MappingFile, source: SourceDatabase) -> KnownSchemas | None:
    """With `source.schemas: catalog`, the routed tables' schemas, read once from the captured
    database, as the mapping's connector encodes them (its decimal/binary/time modes)."""
    if mapping.schema_source is not SchemaSource.CATALOG:
        return None
    with psycopg.connect(source.conninfo) as conn:
        # The heartbeat table's records are parsed too (watermarks), so it needs a schema.
        return known_schemas(conn, mapping.read_tables(), converter_modes(mapping))


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


class ConsumerJob:
    """One consumer's pipeline and streaming query."""

    def __init__(self, consumer: Consumer, shared: SharedParts) -> None:
        self.consumer = consumer
        self.shared = shared
        mapping = self.mapping = consumer.mapping
        options, connections = shared.options, shared.connections
        checkpoint = self.checkpoint_dir = consumer.checkpoint_dir
        if consumer.is_document:
            start_over_unless_state_fits(consumer)
        # A document renders a root once its other tables are whole: read in the log's order,
        # a snapshot's earlier tables end in early batches and the roots render batch by batch
        # as they are read, not all in the backlog's last batch (issue 26).
        self.source = source_options(
            options,
            bootstrap=connections.require("kafka_bootstrap"),
            flavor=connections.kafka_flavor,
            topics=mapping.topics(),
            oldest_first=consumer.is_document,
            log_relay=shared.relay.address,
        )
        retry = options.sink_retry(shared.health)
        modes = converter_modes(mapping)
        spec = dataclasses.replace(
            TaskSinkSpec.for_job(mapping, connections, retry, modes, shared.database.conninfo),
            relay=shared.relay.address,
        )
        delta = build_delta_sink(mapping, options.warehouse, shared.spark, retry)
        self.driver_sinks: list[Sink] = [delta] if delta is not None else []
        # The driver's own row sinks: target set-up (`ensure_target`) and tools; tasks write.
        self.sinks = spec.open_sinks(shared.health) + self.driver_sinks
        self.spec = spec
        self.generated = GeneratedColumns.for_database(shared.database.conninfo, modes)
        # A document consumer writes through a search sink of its own (job.consumers).
        self.document_writer = document_writer(consumer, connections, retry)
        self.documents = (
            DocumentSync.beside_checkpoint(
                mapping,
                checkpoint,
                self.document_writer,
                options.max_offsets_per_trigger,
                bulks_in_flight=options.document_bulks_in_flight,
            )
            if self.document_writer is not None
            else None
        )
        shared.health.track(sink.name for sink in self.sinks)
        if self.document_writer is not None:
            shared.health.track([self.document_writer.name])
        self.dead_letters = DeadLetterWriter(
            connections.require("kafka_bootstrap"),
            connections.kafka_flavor,
            mapping.dead_letter_topic,
            DeadLetterLedger.beside_checkpoint(checkpoint),  # once per batch
        )
        # `cdc-sync status` reads what this writes beside the checkpoint, after every batch.
        self.status = StatusRecorder(
            checkpoint,
            mapping.path.stem,
            sink_tables(mapping, self.sinks)
            if self.documents is None
            else {consumer.name: sorted(mapping.tables)},
            shared.health,
            consumer=consumer.name,
        )
        # Read-your-writes: the applied watermark, recorded in this consumer's sink after each
        # batch, on its own thread (the next batch does not wait for it).
        self.watermarks = WatermarkObserver(
            mapping,
            self.sinks,
            EndOffsets(connections.require("kafka_bootstrap"), connections.kafka_flavor),
            checkpoint,
        )
        observers: list[BatchObserver] = [self.watermarks, *shared.observers, self.status]
        if shared.metrics is not None:
            observers.append(shared.metrics.observer(consumer.name))
        if shared.progress is not None:
            observers.append(shared.progress.observer(consumer.name))
        observers.append(BatchLine(lambda: self.watermarks.watermark, consumer=consumer.name))
        # The accepted schemas belong to this query's checkpoint: a new checkpoint, a new baseline.
        self.applier = BatchApplier(
            mapping,
            self.sinks,
            self.dead_letters,
            None,  # the TOAST fill runs in the write tasks (spec.source_conninfo)
            FileSchemaStore.beside_checkpoint(checkpoint),
            observers,
            TruncateFences(FileTruncateFences.beside_checkpoint(checkpoint)),
            self.documents,
            self.generated,
            consumer=consumer.name,
        )
        self.processor = MicroBatchProcessor(
            self.applier,
            spec,
            self.driver_sinks,
            catalog_schemas(mapping, shared.database),
            FileVersionFloors.beside_checkpoint(checkpoint),
            small_batches(options, self.source, checkpoint),
            FileOpenTransactions.beside_checkpoint(checkpoint),
        )
        every = options.maintain_every_batches
        self.upkeep = EveryNBatches(every, self.maintain) if every and delta is not None else None
        self.query: StreamingQuery | None = None  # the running query, once started
        # The Python error that ended the query's last batch, if one did (`failed_for_good`).
        self.failure: BaseException | None = None
        self.targets_ready = False

    @property
    def name(self) -> str:
        return self.consumer.name

    def ensure_targets(self) -> None:
        """Indices, Delta tables and document indices exist (and are typed) before streaming."""
        for route in self.mapping.tables.values():
            for sink in self.sinks:
                sink.ensure_target(route, None)
        if self.documents is not None:
            modes = converter_modes(self.mapping)
            self.documents.ensure_targets(
                document_schemas(self.mapping, self.shared.database, modes),
                document_types(self.mapping, self.shared.database),
            )

    def start(self, available_now: bool = False) -> StreamingQuery:
        options = self.shared.options
        stream = stream_with_options(self.shared.spark, self.source)
        name = f"{options.query_prefix(self.mapping)}-{self.name.replace(':', '-')}"
        writer = (
            stream.writeStream.queryName(name)
            .foreachBatch(self._batch)
            .option("checkpointLocation", str(self.checkpoint_dir))
        )
        if available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{options.trigger_seconds} seconds")
        query = self.query = writer.start()
        self.status.start_heartbeat(lambda: query_state(query))
        return query

    def failed_for_good(self) -> bool:
        """Whether the query's failure will not pass by starting it again: any error of the
        job's own but a sink or broker that did not answer in time (a failure of Spark's, with
        no error of the batch's, may pass too)."""
        return self.failure is not None and not may_pass(self.failure)

    def _batch(self, batch: DataFrame, batch_id: int) -> None:
        try:
            self._apply(batch, batch_id)
        except BaseException as exc:
            self.failure = exc
            raise_for_spark(exc, batch_id, self.query)
        self.failure = None

    def _apply(self, batch: DataFrame, batch_id: int) -> None:
        self.shared.all_started.wait()
        if not self.targets_ready:
            # Here, not before the query starts: a sink that is down holds its own consumer's
            # first batch (retried), never the other consumers' start (invariant 8).
            self.ensure_targets()
            self.targets_ready = True
        # Each consumer's Spark jobs run in a fair-scheduler pool of its own (spark_session):
        # a long batch of one consumer does not queue the others' tasks behind it.
        self.shared.spark.sparkContext.setLocalProperty("spark.scheduler.pool", self.name)
        # Spark's phases of the previous batch (offsets, planning, logs) beside the batch lines.
        log_previous_batch(self.query, batch_id, self.name)
        self.processor(batch, batch_id)
        if self.upkeep is not None:  # between batches: never beside this job's own MERGE
            self.upkeep.after_batch()

    def maintain(self) -> None:
        """Delta upkeep of every routed table, with the default vacuum retention."""
        options = UpkeepOptions(self.mapping.tombstone_retention_seconds)
        for route in self.mapping.tables.values():
            if route.delta is not None:
                maintain_route(self.shared.options.warehouse, route.delta, options)

    def close(self) -> None:
        self.watermarks.close()  # first: it records the last watermark through the sinks
        self.status.close()
        for sink in self.sinks:
            sink.close()
        self.dead_letters.close()
        self.generated.close()
        release_task_sinks(self.spec)  # the clients the driver's own tasks opened
        if self.documents is not None:
            self.documents.close()
        if self.document_writer is not None:
            self.document_writer.close()


def start_over_unless_state_fits(consumer: Consumer) -> None:
    """A document consumer whose state does not belong to its checkpoint (lost, restored from
    an older copy, or the checkpoint replaced) must not render from it: it starts over on a new
    checkpoint, replaying the topics into a new index behind the alias (readers keep the
    current documents until the new index has caught up). The flat sinks are not touched."""
    checkpoint = consumer.checkpoint_dir
    reason = state_fits_checkpoint(checkpoint, checkpoint / STATE_FILE)
    if reason is None:
        return
    logging.getLogger(CONSOLE).info(
        "%s: %s; starting this document index over on a new checkpoint (its topics are "
        "replayed into a new index behind the alias; readers keep the current documents "
        "until it has caught up)",
        consumer.name,
        reason,
    )
    shutil.rmtree(checkpoint)


def document_writer(
    consumer: Consumer, connections: Connections, retry: RetryPolicy
) -> SearchSink | None:
    """Where a document consumer writes its documents: a search sink named after the consumer
    (its retries and health are the document index's, not the flat search routes')."""
    mapping = consumer.mapping
    if not mapping.documents:
        return None
    if not connections.search_url:
        names = ", ".join(sorted(mapping.documents))
        raise ConfigError(
            mapping.path, "documents", f"{names} need a search server: set CDC_SYNC_SEARCH_URL"
        )
    return SearchSink(
        connections.search_client,
        connections.search_url,
        tombstone_retention_seconds=mapping.tombstone_retention_seconds,
        retry=retry,
        name=consumer.name,
    )


def query_state(query: StreamingQuery) -> tuple[str, str | None]:
    """running | stopped | failed, and the failure's class and first line."""
    if query.isActive:
        return "running", None
    error = query.exception()
    if error is None:
        return "stopped", None
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return "failed", f"{type(error).__name__}: {first}"[:300]
