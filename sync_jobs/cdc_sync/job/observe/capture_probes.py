"""Background reads of what the job's metrics show about other systems.

The broker's end offsets (for lag in records), the replication slots of the source database and
the Kafka Connect connector's state are read by one daemon thread every `interval_seconds`, each
read bounded by its own timeout; a scrape only takes the latest readings. A failed read is logged
when it starts failing and when it recovers (not on every round), and its values disappear from
the metrics until it succeeds again (stale figures would look healthy).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition

from cdc_sync.core.kafka_clients import consumer_config
from cdc_sync.debezium.slots import Slot, list_slots

log = logging.getLogger(__name__)

READ_TIMEOUT_SECONDS = 5.0

EndOffsets = dict[tuple[str, int], int]


@dataclass(frozen=True)
class ConnectorState:
    state: str  # RUNNING, PAUSED, FAILED...
    tasks: dict[str, int]  # task state -> how many tasks are in it


def connector_state(status: Mapping[str, Any]) -> ConnectorState:
    """From Kafka Connect's `GET /connectors/<name>/status` answer."""
    tasks: dict[str, int] = {}
    for task in status.get("tasks") or []:
        tasks[str(task.get("state"))] = tasks.get(str(task.get("state")), 0) + 1
    return ConnectorState(str((status.get("connector") or {}).get("state")), tasks)


@dataclass(frozen=True)
class CaptureReadings:
    """The latest successful reading of each probe (None: not configured, or failing)."""

    end_offsets: EndOffsets | None = None
    slots: list[Slot] | None = None
    connector: ConnectorState | None = None
    succeeded: dict[str, bool] = field(default_factory=dict)  # probe name -> latest read ok


class BrokerEndOffsets:
    """High watermarks of every partition of the job's topics, through confluent-kafka."""

    def __init__(
        self, bootstrap: str, flavor: str, topics: list[str], timeout: float = READ_TIMEOUT_SECONDS
    ) -> None:
        self.topics = topics
        self.timeout = timeout
        self._consumer = Consumer(consumer_config(bootstrap, flavor, "cdc-sync-metrics"))

    def __call__(self) -> EndOffsets:
        ends: EndOffsets = {}
        for topic in self.topics:
            metadata = self._consumer.list_topics(topic, timeout=self.timeout).topics.get(topic)
            if metadata is None or metadata.error is not None:
                continue  # not created yet: nothing to lag behind
            for partition in metadata.partitions:
                _, high = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=self.timeout, cached=False
                )
                ends[(topic, partition)] = high
        return ends

    def close(self) -> None:
        self._consumer.close()


class SourceSlots:
    """The replication slots of the job's source database (`debezium.database`)."""

    def __init__(self, conninfo: str, timeout: float = READ_TIMEOUT_SECONDS) -> None:
        self.conninfo = conninfo
        self.timeout = timeout

    def __call__(self) -> list[Slot]:
        with psycopg.connect(self.conninfo, connect_timeout=max(1, int(self.timeout))) as conn:
            return list_slots(conn, conn.info.dbname)


class CaptureProbes:
    """Runs the configured reads every `interval_seconds` on a daemon thread."""

    def __init__(
        self,
        end_offsets: Callable[[], EndOffsets] | None = None,
        slots: Callable[[], list[Slot]] | None = None,
        connector_status: Callable[[], Mapping[str, Any]] | None = None,
        interval_seconds: float = 10.0,
    ) -> None:
        self._reads: dict[str, Callable[[], Any]] = {}
        if end_offsets is not None:
            self._reads["broker"] = end_offsets
        if slots is not None:
            self._reads["slot"] = slots
        if connector_status is not None:
            self._reads["connector"] = lambda: connector_state(connector_status())
        self.interval_seconds = interval_seconds
        self._values: dict[str, Any] = {}
        self._succeeded: dict[str, bool] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="cdc-sync-metrics-probes")
        self._thread.daemon = True
        self._thread.start()

    def stop(self) -> bool:
        """Stop the reads; False when a read still hangs (its clients must stay open)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * READ_TIMEOUT_SECONDS)
            return not self._thread.is_alive()
        return True

    def readings(self) -> CaptureReadings:
        with self._lock:
            return CaptureReadings(
                end_offsets=self._values.get("broker"),
                slots=self._values.get("slot"),
                connector=self._values.get("connector"),
                succeeded=dict(self._succeeded),
            )

    def read_once(self) -> None:
        """One round of every read (the thread's loop; tests call it directly)."""
        for name, read in self._reads.items():
            try:
                value = read()
            except Exception as exc:  # any failure of another system: report, keep going
                self._record(name, None, ok=False, error=exc)
            else:
                self._record(name, value, ok=True)

    def _record(self, name: str, value: Any, ok: bool, error: Exception | None = None) -> None:
        with self._lock:
            was_ok = self._succeeded.get(name, True)
            self._succeeded[name] = ok
            if ok:
                self._values[name] = value
            else:
                self._values.pop(name, None)
        if not ok and was_ok:
            reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            log.warning("metrics: reading the %s failed (%s); retrying", name, reason)
        elif ok and not was_ok:
            log.info("metrics: reading the %s works again", name)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.read_once()
            self._stop.wait(self.interval_seconds)
