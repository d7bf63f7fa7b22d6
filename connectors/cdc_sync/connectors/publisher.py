"""Publish Debezium records as Kafka Connect would: same topic, key, value and partition.

`publish_batch` returns only once every record of the batch is acknowledged by the broker; the
engine commits source offsets after that, so a crash can repeat records but never lose one. A
slow broker is waited for: each record ends delivered or failed by the producer's own delivery
timeout (librdkafka's `message.timeout.ms`, 5 minutes unless set), and only a failure ends the
capture. (Giving up after a fixed minute instead ended a 550,000-row snapshot on a busy broker
stand-in, whose acknowledgements lagged: the snapshot starts over from its first row.)

On the Tansu stand-in, whose ListOffsets(LATEST) answers the last produce batch's first offset
+ 1, the records go in batches (one record a request cut its produce rate ~30x), and each
partition's last record of a publish goes alone, after the rest is acknowledged: once a publish
returns, every partition's end offset is exact again (mid-publish it may lag, never lead).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_sync.connectors.partitioner import partition_for
from cdc_sync.core.kafka_clients import admin_config, producer_config

log = logging.getLogger(__name__)

# How long `close` waits for what is still queued.
FLUSH_TIMEOUT_SECONDS = 60.0
# While the broker lags, how often the publisher says how many records it has yet to
# acknowledge, and how often it looks whether the capture is stopping.
REPORT_SECONDS = 60.0
WAIT_SLICE_SECONDS = 0.5
# librdkafka's default `message.timeout.ms`: every record has a delivery report by then.
DEFAULT_DELIVERY_TIMEOUT_MS = 300_000
# How long a topic's partition count is trusted (the Java producer's `metadata.max.age.ms`).
PARTITION_COUNT_SECONDS = 300.0
METADATA_SECONDS = 30.0
# confluent-kafka's own default for `produce(partition=...)`: the producer's partitioner chooses.
ANY_PARTITION = -1


@dataclass(frozen=True)
class Record:
    topic: str
    key: bytes | None
    value: bytes | None  # None: a tombstone (after a delete, for log compaction)


@dataclass(frozen=True)
class TopicSettings:
    partitions: int
    replication_factor: int
    config: dict[str, str]

    @classmethod
    def from_connector(cls, config: Mapping[str, Any]) -> TopicSettings:
        """Kafka Connect's `topic.creation.default.*` settings, applied the same way."""
        prefix = "topic.creation.default."
        extra = {
            key[len(prefix) :]: str(value)
            for key, value in config.items()
            if key.startswith(prefix)
            and key[len(prefix) :] not in ("partitions", "replication.factor")
        }
        return cls(
            partitions=int(config.get(f"{prefix}partitions", 1)),
            replication_factor=int(config.get(f"{prefix}replication.factor", 1)),
            config=extra,
        )


def record_key(record: Record) -> bytes | None:
    """The record's own key; a keyless event (Debezium's truncate events) gets one naming its
    topic: Apache Kafka refuses keyless records on a compacted topic, and on one the newest
    truncate of a table is the one that matters (it removes every row older than itself). The
    job decodes a truncate by its value, whatever its key."""
    if record.key is not None or record.value is None:
        return record.key
    return json.dumps({"cdc_sync_keyless_event": record.topic}).encode()


class PublishError(RuntimeError):
    """Records were not acknowledged: the engine must not commit their source offsets."""


class KafkaPublisher:
    def __init__(
        self, bootstrap: str, flavor: str, topics: TopicSettings, **producer_settings: Any
    ) -> None:
        """`producer_settings`: librdkafka settings over the project's (`message.timeout.ms`,
        how long a record may wait for the broker before it fails)."""
        # murmur2 is the Java client's partitioner: the same key lands on the same partition
        # as with Kafka Connect, whatever created the topic.
        self.last_records_alone = flavor == "tansu"
        config = producer_config(
            bootstrap,
            flavor,
            single_record_batches=not self.last_records_alone,
            **{"partitioner": "murmur2_random", "acks": "all", **producer_settings},
        )
        self.producer = Producer(config)
        # A record has its delivery report by then; past it (and a report's wait more), the
        # producer itself is stuck.
        timeout_ms = int(config.get("message.timeout.ms", DEFAULT_DELIVERY_TIMEOUT_MS))
        self.give_up_seconds = timeout_ms / 1000 + REPORT_SECONDS
        self._stopping = threading.Event()
        self.bootstrap = bootstrap
        self.topics = topics
        self.known_topics: set[str] = set()
        self._partition_counts: dict[str, tuple[int, float]] = {}
        self.published = 0

    def publish_batch(self, records: Sequence[Record]) -> None:
        self._ensure_topics({r.topic for r in records})
        if not self.last_records_alone:
            self._deliver([(record, ANY_PARTITION) for record in records])
        else:
            body, last = self._split_last_records(records)
            self._deliver(body)
            self._deliver(last)  # one record per partition: each its own produce batch
        self.published += len(records)

    def _split_last_records(
        self, records: Sequence[Record]
    ) -> tuple[list[tuple[Record, int]], list[tuple[Record, int]]]:
        """The records with their partitions, less each partition's last record; and those."""
        placed = [(record, self._partition(record)) for record in records]
        last_at: dict[tuple[str, int], int] = {}
        for position, (record, partition) in enumerate(placed):
            last_at[(record.topic, partition)] = position
        last_positions = set(last_at.values())
        body = [pair for position, pair in enumerate(placed) if position not in last_positions]
        return body, [placed[position] for position in sorted(last_positions)]

    def _partition(self, record: Record) -> int:
        key = record_key(record)
        return 0 if key is None else partition_for(key, self._partition_count(record.topic))

    def _partition_count(self, topic: str) -> int:
        known = self._partition_counts.get(topic)
        now = time.monotonic()
        if known is not None and now - known[1] < PARTITION_COUNT_SECONDS:
            return known[0]
        deadline = now + METADATA_SECONDS
        while True:  # a topic created a moment ago may not have its partitions listed yet
            metadata = self.producer.list_topics(topic, timeout=METADATA_SECONDS).topics[topic]
            if metadata.error is None and metadata.partitions:
                self._partition_counts[topic] = (len(metadata.partitions), now)
                return len(metadata.partitions)
            if time.monotonic() > deadline:
                raise PublishError(
                    f"no partitions known for topic {topic} after {METADATA_SECONDS:.0f}s: "
                    f"{metadata.error}"
                )
            time.sleep(0.2)

    def _deliver(self, records: Sequence[tuple[Record, int]]) -> None:
        """Produce `records` (each with its partition, `ANY_PARTITION`: the producer's choice)
        and return once every one is acknowledged."""
        errors: list[KafkaError] = []

        def on_delivery(err: KafkaError | None, _message: Any) -> None:
            if err is not None:
                errors.append(err)

        for record, partition in records:
            self._produce(record, partition, on_delivery)
        started = reported = time.monotonic()
        while (remaining := self.producer.flush(WAIT_SLICE_SECONDS)) and not errors:
            now = time.monotonic()
            if self._stopping.is_set() or now - started > self.give_up_seconds:
                break
            if now - reported >= REPORT_SECONDS:
                reported = now
                log.warning(
                    "the broker has not acknowledged %d of %d records after %.0f s; waiting "
                    "for it (each record fails at the producer's message.timeout.ms)",
                    remaining,
                    len(records),
                    now - started,
                )
        if remaining or errors:
            raise PublishError(
                f"{len(errors)} records failed, {remaining} unacknowledged after "
                f"{time.monotonic() - started:.0f}s: {errors[:1]}"
            )

    def _produce(self, record: Record, partition: int, on_delivery: Any) -> None:
        key = record_key(record)
        while True:
            try:
                self.producer.produce(
                    record.topic,
                    key=key,
                    value=record.value,
                    partition=partition,
                    on_delivery=on_delivery,
                )
                return
            except BufferError:  # local queue full: let deliveries drain, then retry
                self.producer.poll(0.5)

    def _ensure_topics(self, topics: Iterable[str]) -> None:
        missing = [t for t in topics if t not in self.known_topics]
        if not missing:
            return
        # An admin client for this call only: one kept by the publisher outlived close() (it
        # has none) and reconnected to a stopped broker every second for as long as the
        # capture object lived (seen in bench_e2e's process after its stack stopped).
        admin = AdminClient(admin_config(self.bootstrap))
        existing = set(admin.list_topics(timeout=10).topics)
        to_create = [t for t in missing if t not in existing]
        if to_create:
            futures = admin.create_topics(
                [
                    NewTopic(
                        t,
                        num_partitions=self.topics.partitions,
                        replication_factor=self.topics.replication_factor,
                        config=self.topics.config,
                    )
                    for t in to_create
                ]
            )
            for topic, future in futures.items():
                try:
                    future.result(timeout=30)
                    log.info("created topic %s %s", topic, self.topics.config)
                except KafkaException as exc:
                    if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                        raise
        self.known_topics.update(missing)

    def stop_waiting(self) -> None:
        """A batch waiting for the broker ends now (PublishError): the capture is stopping, and
        its offsets are not committed, so the records are sent again at the next start."""
        self._stopping.set()

    def close(self) -> None:
        self.producer.flush(FLUSH_TIMEOUT_SECONDS)
        self.producer.close()
