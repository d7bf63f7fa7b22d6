"""Debezium change events as they sit in a topic: their `source` block, for ordering tests."""

from __future__ import annotations

import json
import uuid
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from cdc_sync.core.kafka_clients import consumer_config
from tests.fixtures.services import KafkaEndpoint


def source_fields(kafka: KafkaEndpoint, topic: str) -> list[dict[str, Any]]:
    """`source` of every change event in the topic, in Kafka order (tombstones skipped),
    with the event's `op` and its row's `id` (`row_id`) added."""
    consumer = Consumer(
        consumer_config(kafka.bootstrap, kafka.flavor, group_id=f"t-{uuid.uuid4()}")
    )
    try:
        high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
        consumer.assign([TopicPartition(topic, 0, 0)])
        events: list[dict[str, Any]] = []
        read = 0
        while read < high:
            message = consumer.poll(10)
            assert message is not None, f"{topic}: {read} of {high} records read"
            read += 1
            value = message.value()
            if value is None:
                continue
            payload = json.loads(value)["payload"]
            row = payload["after"] or payload["before"] or {}
            source = dict(payload["source"])
            # JSON text of [last commit, lsn], positions as decimal strings or null.
            source["sequence"] = [
                None if p is None else int(p) for p in json.loads(source["sequence"])
            ]
            events.append(source | {"op": payload["op"], "row_id": row.get("id")})
        return events
    finally:
        consumer.close()
