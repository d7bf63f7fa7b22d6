"""Broker side of the status: end offsets against the job's, the oldest record still waiting."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from cdc_sync.source.offsets import PartitionOffsets
from cdc_sync.status.model import PartitionStatus

TIMEOUT_SECONDS = 5.0


def _partitions(consumer: Consumer, topic: str) -> list[int]:
    metadata = consumer.list_topics(topic, timeout=TIMEOUT_SECONDS).topics.get(topic)
    if metadata is None or metadata.error is not None:
        return []  # not created yet: nothing captured, nothing dead-lettered
    return sorted(metadata.partitions)


def partition_status(
    config: Mapping[str, Any], topics: list[str], processed: PartitionOffsets
) -> list[PartitionStatus]:
    """Per partition of `topics`: low and end offsets, the job's processed offset, and the
    timestamp of the first record not processed yet (how long the job is behind)."""
    consumer = Consumer(dict(config))
    try:
        found = []
        for topic in topics:
            for partition in _partitions(consumer, topic):
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=TIMEOUT_SECONDS
                )
                found.append(
                    PartitionStatus(
                        topic, partition, int(high), int(low), processed.get((topic, partition))
                    )
                )
        oldest = _first_timestamps(consumer, [p for p in found if p.waiting])
        return [
            PartitionStatus(
                p.topic,
                p.partition,
                p.end_offset,
                p.low_offset,
                p.processed_offset,
                oldest.get((p.topic, p.partition)),
            )
            for p in found
        ]
    finally:
        consumer.close()


def _first_timestamps(
    consumer: Consumer, waiting: list[PartitionStatus]
) -> dict[tuple[str, int], int]:
    """The Kafka timestamp (ms) of each partition's first unprocessed record."""
    if not waiting:
        return {}
    consumer.assign(
        [
            TopicPartition(p.topic, p.partition, max(p.processed_offset or 0, p.low_offset))
            for p in waiting
        ]
    )
    pending = {(p.topic, p.partition) for p in waiting}
    found: dict[tuple[str, int], int] = {}
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while pending and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None or message.error() is not None:
            continue
        where = (message.topic(), message.partition())
        if where in pending:
            found[where] = int(message.timestamp()[1])
            pending.discard(where)
            consumer.pause([TopicPartition(*where)])
    return found


def record_count(config: Mapping[str, Any], topic: str) -> int:
    """Records the topic holds (end minus low offset, summed over partitions)."""
    consumer = Consumer(dict(config))
    try:
        total = 0
        for partition in _partitions(consumer, topic):
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=TIMEOUT_SECONDS
            )
            total += int(high) - int(low)
        return total
    finally:
        consumer.close()


__all__ = ["KafkaException", "partition_status", "record_count"]
