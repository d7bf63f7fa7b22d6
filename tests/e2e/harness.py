"""One sync pipeline on the test services: its own database, topic prefix, Redis db and warehouse.

Capture (embedded Debezium, the real connector JSON) runs for the whole module; the Spark job runs
continuously and can be stopped, restarted on its checkpoint, or replaced by a fresh-checkpoint
replay of every topic from offset 0.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from pyspark.sql import SparkSession

from cdc_sync.core.model import TableId
from cdc_sync.core.settings import Connections
from cdc_sync.job.observe.metrics_export import ConnectorStatus
from cdc_sync.job.runner import JobOptions, QueryGroup, SyncJob
from cdc_sync.mapping import MappingFile, load_mapping
from cdc_sync.sinks.search import readback as search_readback
from cdc_sync.sinks.search.backends import open_backend
from cdc_sync.verify.compare import Report, primary_key, verify_all

MAPPING = Path("mappings/shop.yaml")


def e2e_mapping(topic_prefix: str, path: Path = MAPPING) -> MappingFile:
    mapping = load_mapping(path)
    return dataclasses.replace(
        mapping, topic_prefix=topic_prefix, dead_letter_topic=f"{topic_prefix}.dead_letter"
    )


class SyncHarness:
    def __init__(
        self, spark: SparkSession, mapping: MappingFile, connections: Connections, root: Path
    ) -> None:
        self.spark = spark
        self.mapping = mapping
        self.connections = connections
        self.root = root
        self.job: SyncJob | None = None
        self.query: QueryGroup | None = None
        # Capture by the embedded engine (tests/e2e/conftest.py): restart it without its
        # offsets, a new initial snapshot, running the callable while it is down.
        self.snapshot_again: Callable[[Callable[[], None]], None] | None = None

    def options(self, checkpoint: str) -> JobOptions:
        return JobOptions(
            checkpoint_dir=self.root / "checkpoints" / checkpoint,
            warehouse=Path(self.connections.require("warehouse")),
            trigger_seconds=0.5,
            query_name=f"cdc-sync-{self.mapping.topic_prefix}-{checkpoint}",
        )

    def start(
        self,
        checkpoint: str = "main",
        connector_status: ConnectorStatus | None = None,
        **options: Any,
    ) -> None:
        """`options`: JobOptions fields to change (e.g. metrics_port)."""
        assert self.query is None, "the job is already running"
        job_options = dataclasses.replace(self.options(checkpoint), **options)
        self.job = SyncJob(
            self.spark,
            self.mapping,
            self.connections,
            job_options,
            connector_status=connector_status,
        )
        self.query = self.job.start()

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()
            self.query = None
        if self.job is not None:
            self.job.close()
            self.job = None

    def drain_fresh(self, checkpoint: str, **options: Any) -> None:
        """A new job with a fresh checkpoint: replays every topic from offset 0, then stops.
        `options`: JobOptions fields to change (e.g. max_offsets_per_trigger)."""
        job_options = dataclasses.replace(self.options(checkpoint), **options)
        job = SyncJob(self.spark, self.mapping, self.connections, job_options)
        try:
            job.drain(timeout_seconds=300)
        finally:
            job.close()

    def run_sql(self, statements: tuple[str, ...] | list[str]) -> None:
        with psycopg.connect(self.connections.require("pg_url"), autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement.encode())

    def documents(self, name: str) -> dict[str, dict[str, Any]]:
        """doc id -> document of the document index `name` (mapping `documents`)."""
        connections = self.connections
        backend = open_backend(connections.search_client, connections.require("search_url"))
        try:
            index = self.mapping.documents[name].index
            return {i: doc for i, (_, doc) in search_readback.documents(backend, index).items()}
        finally:
            backend.close()

    def key_columns(self, table: TableId) -> list[str]:
        with psycopg.connect(self.connections.require("pg_url")) as conn:
            return primary_key(conn, table)

    def wait_converged(self, timeout_seconds: float = 120.0) -> Report:
        """Poll until every sink equals the source; fail with the last report otherwise."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            self.raise_if_failed()
            report = verify_all(self.mapping, self.connections)
            if report.converged:
                return report
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"sinks did not converge in {timeout_seconds}s:\n{report.table()}"
                )
            time.sleep(1.0)

    def raise_if_failed(self) -> None:
        if self.query is not None and self.query.exception() is not None:
            raise AssertionError(f"sync job failed: {self.query.exception()}")
