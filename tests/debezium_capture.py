"""Real Debezium (the embedded engine) on a test's own tables, and the raw records it wrote.

For tests that observe what Debezium emits before the project decodes it: one engine on a
private database, a topic prefix of its own, no heartbeats (their table is not there), the slot
dropped on stop.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from cdc_sync.connectors.engine import CaptureEngine
from cdc_sync.core.kafka_clients import consumer_config
from cdc_sync.core.model import Change, Coordinates
from cdc_sync.core.settings import Connections
from cdc_sync.debezium.decoder import parse_record
from tests.fixtures.services import KafkaEndpoint

CONNECTOR = Path("connectors/shop.json")


@dataclass(frozen=True)
class RawRecord:
    key: bytes | None
    value: bytes | None
    coordinates: Coordinates

    def change(self) -> Change:
        parsed = parse_record(self.key, self.value, self.coordinates)
        assert isinstance(parsed, Change), parsed
        return parsed


@contextmanager
def captured(
    database_url: str,
    kafka: KafkaEndpoint,
    state: Path,
    tables: list[str],
    overrides: Mapping[str, str] | None = None,
    ready_seconds: float = 120,
) -> Iterator[str]:
    """Capture `tables` (schema.table) until the block ends; yields the topic prefix."""
    prefix = f"obs{uuid.uuid4().hex[:8]}"
    connections = Connections(
        database_url, kafka.bootstrap, kafka.flavor, None, "opensearch", None, None, None
    )
    settings = {
        "topic.prefix": prefix,
        "slot.name": prefix,
        "publication.name": prefix,
        "schema.include.list": ",".join(sorted({t.split(".")[0] for t in tables})),
        "table.include.list": ",".join(tables),
        "signal.data.collection": "",
        "heartbeat.interval.ms": "0",
        "slot.drop.on.stop": "true",
        "poll.interval.ms": "20",
        **(overrides or {}),
    }
    engine = CaptureEngine.from_file(CONNECTOR, connections, state, settings)
    engine.start()
    try:
        engine.wait_ready(timeout_seconds=ready_seconds)
        yield prefix
    finally:
        engine.stop()


class TopicReader:
    """Reads one single-partition topic from the start, keeping its place between calls."""

    def __init__(self, kafka: KafkaEndpoint, topic: str) -> None:
        self.topic = topic
        self.records: list[RawRecord] = []
        self._consumer = Consumer(
            consumer_config(kafka.bootstrap, kafka.flavor, group_id=f"t-{uuid.uuid4()}")
        )
        self._consumer.assign([TopicPartition(topic, 0, 0)])

    def close(self) -> None:
        self._consumer.close()

    def wait_for(
        self, done: Callable[[list[RawRecord]], bool], timeout: float = 60
    ) -> list[RawRecord]:
        """Every record read so far, once `done(records)` holds."""
        deadline = time.monotonic() + timeout
        while not done(self.records):
            assert time.monotonic() < deadline, f"{self.topic}: {len(self.records)} records"
            message = self._consumer.poll(0.2)
            if message is None or message.error() is not None:
                continue
            offset = message.offset()
            assert offset is not None
            self.records.append(
                RawRecord(message.key(), message.value(), Coordinates(self.topic, 0, offset))
            )
        return self.records

    def wait_count(self, count: int, timeout: float = 60) -> list[RawRecord]:
        return self.wait_for(lambda records: len(records) >= count, timeout)
