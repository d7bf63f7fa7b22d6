"""Assemble and run the sync job: mapping + connections -> sinks -> streaming query."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from cdc_sync.core.model import KnownSchemas
from cdc_sync.core.retry import (
    DEFAULT_ATTEMPT_TIMEOUT_SECONDS,
    DEFAULT_HORIZON_SECONDS,
    DEFAULT_POLICY,
    RetryObserver,
    RetryPolicy,
)
from cdc_sync.core.settings import Connections, state_dir
from cdc_sync.debezium.connector import load_connector
from cdc_sync.job.applier import BatchApplier, BatchObserver
from cdc_sync.job.dead_letter import DeadLetterWriter
from cdc_sync.job.health import SinkHealth, SinkStatus
from cdc_sync.job.schema_store import FileSchemaStore
from cdc_sync.job.stream import MicroBatchProcessor
from cdc_sync.job.unavailable import SourceFiller
from cdc_sync.mapping import MappingFile, SchemaSource
from cdc_sync.schema.catalog import ConverterModes, known_schemas
from cdc_sync.sinks.base import Sink
from cdc_sync.sinks.delta import DeltaSink
from cdc_sync.sinks.delta.spark_client import DeltaSparkWriter, delta_spark_available
from cdc_sync.source import kafka_stream

log = logging.getLogger(__name__)

# Records per micro-batch at most: after an outage one batch would otherwise hold the whole
# backlog in memory (83,772 records were seen in one). ~20k keeps a batch within seconds.
DEFAULT_MAX_OFFSETS_PER_TRIGGER = 20_000


@dataclass(frozen=True)
class JobOptions:
    checkpoint_dir: Path
    warehouse: Path
    trigger_seconds: float = 1.0
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
            checkpoint_dir=root / "checkpoints" / mapping.path.stem,
            warehouse=Path(connections.warehouse) if connections.warehouse else root / "warehouse",
        )


def job_stream(
    spark: SparkSession, options: JobOptions, *, bootstrap: str, flavor: str, topics: list[str]
) -> DataFrame:
    """The Kafka stream the job reads: bounded per micro-batch and checked for data loss as
    ``options`` say."""
    return kafka_stream(
        spark,
        bootstrap=bootstrap,
        flavor=flavor,
        topics=topics,
        max_offsets_per_trigger=options.max_offsets_per_trigger,
        fail_on_data_loss=options.fail_on_data_loss,
    )


def build_sinks(
    mapping: MappingFile,
    connections: Connections,
    warehouse: Path,
    spark: SparkSession,
    retry: RetryPolicy = DEFAULT_POLICY,
) -> list[Sink]:
    """The sinks the mapping routes to; a routed sink without a configured URL is an error.
    Each writes under `retry` (named after the sink)."""
    retention = mapping.tombstone_retention_seconds
    routes = list(mapping.tables.values())
    sinks: list[Sink] = []
    if any(r.search for r in routes):
        from cdc_sync.sinks.search import SearchSink

        sinks.append(
            SearchSink(
                connections.search_client,
                connections.require("search_url"),
                tombstone_retention_seconds=retention,
                retry=retry,
            )
        )
    if any(r.cache for r in routes):
        from cdc_sync.sinks.redis import RedisSink

        sinks.append(
            RedisSink(
                connections.require("redis_url"), tombstone_retention_seconds=retention, retry=retry
            )
        )
    if any(r.delta for r in routes):
        writer = (
            DeltaSparkWriter(spark, warehouse, retention) if delta_spark_available(spark) else None
        )
        log.info("Delta writes through %s", "delta-spark" if writer else "deltalake (delta-rs)")
        sinks.append(DeltaSink(warehouse, retention, writer, retry))
    return sinks


def catalog_schemas(mapping: MappingFile, connections: Connections) -> KnownSchemas | None:
    """With `source.schemas: catalog`, the routed tables' schemas, read once from Postgres, as
    the mapping's connector encodes them (its decimal/binary/time modes)."""
    if mapping.schema_source is not SchemaSource.CATALOG:
        return None
    with psycopg.connect(connections.require("pg_url")) as conn:
        return known_schemas(conn, mapping.tables, converter_modes(mapping))


def converter_modes(mapping: MappingFile) -> ConverterModes:
    """How the mapping's connector encodes values (Debezium's defaults without a connector)."""
    config = load_connector(mapping.connector).config if mapping.connector else {}
    return ConverterModes.from_connector(config)


class SyncJob:
    def __init__(
        self,
        spark: SparkSession,
        mapping: MappingFile,
        connections: Connections,
        options: JobOptions,
        observers: Sequence[BatchObserver] = (),
    ) -> None:
        self.spark = spark
        self.mapping = mapping
        self.connections = connections
        self.options = options
        # Every sink's retries report here: `sink_status()` says which one the job waits for.
        self.health = SinkHealth()
        self.sinks = build_sinks(
            mapping, connections, options.warehouse, spark, options.sink_retry(self.health)
        )
        self.health.track(sink.name for sink in self.sinks)
        self.dead_letters = DeadLetterWriter(
            connections.require("kafka_bootstrap"),
            connections.kafka_flavor,
            mapping.dead_letter_topic,
        )
        self.filler = SourceFiller(connections.require("pg_url"), converter_modes(mapping))
        # The accepted schemas belong to this query's checkpoint: a new checkpoint, a new baseline.
        self.applier = BatchApplier(
            mapping,
            self.sinks,
            self.dead_letters,
            self.filler,
            FileSchemaStore.beside_checkpoint(options.checkpoint_dir),
            observers,
        )
        self.processor = MicroBatchProcessor(
            self.applier,
            int(spark.conf.get("spark.sql.shuffle.partitions") or 2),
            catalog_schemas(mapping, connections),
        )

    def start(self, available_now: bool = False) -> StreamingQuery:
        for route in self.mapping.tables.values():
            for sink in self.sinks:
                sink.ensure_target(route, None)
        stream = job_stream(
            self.spark,
            self.options,
            bootstrap=self.connections.require("kafka_bootstrap"),
            flavor=self.connections.kafka_flavor,
            topics=self.mapping.topics(),
        )
        writer = (
            stream.writeStream.queryName(
                self.options.query_name or f"cdc-sync-{self.mapping.path.stem}"
            )
            .foreachBatch(self.processor)
            .option("checkpointLocation", str(self.options.checkpoint_dir))
        )
        if available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{self.options.trigger_seconds} seconds")
        log.info(
            "sync job started: %d tables, checkpoint %s",
            len(self.mapping.tables),
            self.options.checkpoint_dir,
        )
        return writer.start()

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
        for sink in self.sinks:
            sink.close()
        self.dead_letters.close()
        self.filler.close()
