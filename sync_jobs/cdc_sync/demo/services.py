"""The demo's moving parts: local stack, embedded capture, streaming sync job; stopped in order."""

from __future__ import annotations

import logging
import shutil
import signal
import threading
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from cdc_sync.core.logs import log_settings
from cdc_sync.core.settings import Connections, default_env_file, state_dir, write_env_file
from cdc_sync.job.runner import JobOptions, QueryGroup, SyncJob
from cdc_sync.job.spark_session import build_spark
from cdc_sync.mapping import MappingFile

log = logging.getLogger(__name__)

DEMO_STATE = ("stack", "checkpoints", "warehouse", "capture")


class DemoServices:
    def __init__(self, broker: str | None) -> None:
        self.broker = broker
        self.stack: Any = None
        self.capture: Any = None
        self.spark: SparkSession | None = None
        self.job: SyncJob | None = None
        self.query: QueryGroup | None = None
        self.connections: Connections | None = None
        self.started_stack = False
        self.connector: tuple[Any, str] | None = None  # (ConnectClient, name) when on a worker

    def up(self) -> Connections:
        """Start the local stack (or reuse one already up) and write its settings file."""
        from cdc_sync.localstack.stack import LocalStack

        self.stack = LocalStack(state_dir() / "stack", broker=self.broker or "tansu")
        self.started_stack = not self.stack.is_up()
        if self.started_stack:
            # The broker and search stand-ins keep nothing across restarts: offsets, checkpoints
            # and tables of an earlier demo would point at records that no longer exist.
            for name in DEMO_STATE:
                shutil.rmtree(state_dir() / name, ignore_errors=True)
        urls = self.stack.start()
        write_env_file(default_env_file(), urls.env(state_dir() / "warehouse"))
        self.connections = Connections.load()
        return self.connections

    def start_capture(self, connector: Path, mapping: MappingFile) -> str:
        """The stack's Kafka Connect worker runs the connector when there is one; else the
        embedded engine. Returns which."""
        assert self.connections is not None
        if self.connections.connect_url:
            from cdc_sync.connectors.ops import wait_for_topics, wait_running, wanted_config
            from cdc_sync.connectors.rest import ConnectClient
            from cdc_sync.debezium.connector import load_connector

            file = load_connector(connector)
            client = ConnectClient(self.connections.connect_url)
            client.put_config(file.name, wanted_config(file, {}))
            wait_running(client, file.name, timeout=120)
            wait_for_topics(self.connections, mapping.topics())
            self.connector = (client, file.name)
            return "Kafka Connect worker"
        from cdc_sync.connectors.engine import CaptureEngine

        state = state_dir() / "capture" / connector.stem
        self.capture = CaptureEngine.from_file(connector, self.connections, state)
        self.capture.start()
        self.capture.wait_ready(timeout_seconds=120)
        return "embedded Debezium engine"

    def start_sync(self, mapping: MappingFile) -> None:
        assert self.connections is not None
        self.spark = build_spark("cdc-sync-demo", jvm_log=log_settings().jvm_log)
        options = JobOptions.defaults(mapping, self.connections)
        self.job = SyncJob(self.spark, mapping, self.connections, options)
        self.query = self.job.start()

    def _delete_connector(self) -> None:
        assert self.connector is not None
        client, name = self.connector
        client.delete(name)

    def raise_if_failed(self) -> None:
        if self.query is not None and self.query.exception() is not None:
            raise RuntimeError(f"sync job failed: {self.query.exception()}")

    def wait_for_interrupt(self) -> None:
        stop = threading.Event()
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        while not stop.wait(1.0):
            self.raise_if_failed()

    def down(self, stop_stack: bool) -> None:
        """Stop the sync job, then capture, then (unless kept) the services; each step guarded."""
        steps: list[tuple[str, Any]] = [
            ("sync job", self.query.stop if self.query else None),
            ("sinks", self.job.close if self.job else None),
            ("spark", self.spark.stop if self.spark else None),
            ("capture", self.capture.stop if self.capture else None),
            # On a stack the demo started, the connector goes with it; otherwise it stays.
            (
                "connector",
                self._delete_connector
                if (self.connector and stop_stack and self.started_stack)
                else None,
            ),
            # A stack that was up before the demo is left as it was.
            (
                "local stack",
                self.stack.stop if (self.stack and stop_stack and self.started_stack) else None,
            ),
        ]
        for name, action in steps:
            if action is None:
                continue
            try:
                action()
            except Exception:  # keep stopping the rest; say what failed
                log.exception("stopping %s failed", name)
