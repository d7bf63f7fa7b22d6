"""Debezium notifications through the `sink` channel: what the connector did with a signal.

With `sink` in `notification.enabled.channels`, Debezium writes every notification to the Kafka
topic `notification.sink.topic.name`, keyed by its id. Incremental-snapshot notifications carry
the id of the `execute-snapshot` signal that asked for them, so one request is followed by id.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

CHANNELS_SETTING = "notification.enabled.channels"
TOPIC_SETTING = "notification.sink.topic.name"
SINK_CHANNEL = "sink"
METADATA_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Notification:
    id: str
    aggregate_type: str  # "Incremental Snapshot", "Initial Snapshot"
    type: str  # STARTED, IN_PROGRESS, TABLE_SCAN_COMPLETED, COMPLETED, ABORTED, PAUSED, ...
    data: Mapping[str, str]
    timestamp: datetime | None


def notification_topic(config: Mapping[str, str]) -> str | None:
    """The sink channel's topic, or None when the connector does not write notifications."""
    channels = [c.strip() for c in config.get(CHANNELS_SETTING, "").split(",")]
    return (config.get(TOPIC_SETTING) or None) if SINK_CHANNEL in channels else None


def parse_notification(value: bytes | None) -> Notification | None:
    """A sink-channel record value (JsonConverter, with or without schemas); None if not one."""
    if value is None:
        return None
    try:
        doc = json.loads(value)
    except ValueError:
        return None
    payload = doc.get("payload", doc) if isinstance(doc, dict) else None
    if not isinstance(payload, dict) or not isinstance(payload.get("id"), str):
        return None
    return Notification(
        id=payload["id"],
        aggregate_type=str(payload.get("aggregate_type", "")),
        type=str(payload.get("type", "")),
        data={str(k): str(v) for k, v in (payload.get("additional_data") or {}).items()},
        timestamp=_timestamp(payload.get("timestamp")),
    )


def _timestamp(value: Any) -> datetime | None:
    try:
        return datetime.fromtimestamp(int(value) / 1000, tz=UTC)  # epoch milliseconds
    except (TypeError, ValueError):
        return None


def describe(notification: Notification) -> str:
    """One line: `<UTC time> <event>: <details>`."""
    stamp = notification.timestamp
    when = stamp.isoformat(timespec="milliseconds") if stamp else "-"
    event = notification.type.lower().replace("_", " ")
    data = notification.data
    if notification.type == "TABLE_SCAN_COMPLETED":
        detail = (
            f"{data.get('scanned_collection', '?')}, {data.get('total_rows_scanned', '?')} rows "
            f"({data.get('status', '?')})"
        )
    elif notification.type == "IN_PROGRESS":
        detail = data.get("current_collection_in_progress", "")
    else:
        detail = data.get("data_collections", "")
    return f"{when} {event}" + (f": {detail}" if detail else "")


class SnapshotOutcome(StrEnum):
    COMPLETED = "completed"
    ABORTED = "aborted"
    INCOMPLETE = "incomplete"  # started, not completed before the notifications ran out
    SILENT = "silent"  # no notification at all: the connector did not pick up the signal


def snapshot_outcome(
    notifications: Iterable[Notification],
    seen: Callable[[Notification], None] = lambda _: None,
) -> SnapshotOutcome:
    """How an incremental snapshot ended, from its notifications (`follow`); `seen` gets
    each one as it arrives."""
    started = False
    for notification in notifications:
        seen(notification)
        started = started or notification.type == "STARTED"
        if notification.type == "COMPLETED":
            return SnapshotOutcome.COMPLETED
        if notification.type == "ABORTED":
            return SnapshotOutcome.ABORTED
    return SnapshotOutcome.INCOMPLETE if started else SnapshotOutcome.SILENT


def end_offsets(config: Mapping[str, Any], topic: str) -> dict[int, int]:
    """Each partition's end offset now; {} while the topic does not exist (Debezium creates it
    with its first notification)."""
    consumer = Consumer(dict(config))
    try:
        return {
            p: int(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1])
            for p in _partitions(consumer, topic)
        }
    finally:
        consumer.close()


def follow(
    config: Mapping[str, Any],
    topic: str,
    start: Mapping[int, int],
    notification_id: str,
    timeout: float,
) -> Generator[Notification, None, None]:
    """The notifications with `notification_id` written after `start`, as they arrive, until
    `timeout` seconds have passed (the caller stops earlier by leaving the loop)."""
    deadline = time.monotonic() + timeout
    consumer: Consumer | None = None
    try:
        while (remaining := deadline - time.monotonic()) > 0:
            if consumer is None:
                consumer = _assigned(config, topic, start)
                if consumer is None:
                    time.sleep(min(0.5, remaining))
                    continue
            message = consumer.poll(min(1.0, remaining))
            if message is None or message.error() is not None:
                continue
            notification = parse_notification(message.value())
            if notification is not None and notification.id == notification_id:
                yield notification
    finally:
        if consumer is not None:
            consumer.close()


def _assigned(config: Mapping[str, Any], topic: str, start: Mapping[int, int]) -> Consumer | None:
    """A consumer assigned to every partition from `start` (from the beginning for partitions
    that did not exist then); None while the topic does not exist yet."""
    # A fresh client each try: librdkafka caches "unknown topic" for minutes.
    consumer = Consumer(dict(config))
    partitions = _partitions(consumer, topic)
    if not partitions:
        consumer.close()
        return None
    consumer.assign([TopicPartition(topic, p, start.get(p, OFFSET_BEGINNING)) for p in partitions])
    return consumer


def _partitions(consumer: Consumer, topic: str) -> list[int]:
    try:
        metadata = consumer.list_topics(topic, timeout=METADATA_TIMEOUT_S).topics.get(topic)
    except KafkaException:
        return []
    if metadata is None or metadata.error is not None:
        return []
    return sorted(metadata.partitions)
