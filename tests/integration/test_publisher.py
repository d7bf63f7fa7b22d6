"""The embedded capture's publisher against a real broker: its records land where the Java
producer puts them, in order, and once a publish returns every partition's end offset is exact.

On the Tansu stand-in the publisher batches records and sends each partition's last record of a
publish alone, because Tansu's ListOffsets(LATEST) answers the last batch's first offset + 1:
with a multi-record last batch the job would never read that batch's tail while the capture is
idle.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc_sync.connectors.partitioner import partition_for
from cdc_sync.connectors.publisher import KafkaPublisher, Record, TopicSettings
from cdc_sync.core.kafka_clients import consumer_config, producer_config
from tests.fixtures.services import KafkaEndpoint

pytestmark = pytest.mark.integration

PARTITIONS = 3


def end_offsets(kafka: KafkaEndpoint, topic: str) -> list[int]:
    consumer = Consumer(consumer_config(kafka.bootstrap, kafka.flavor, group_id="ends"))
    try:
        return [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
            for p in range(PARTITIONS)
        ]
    finally:
        consumer.close()


def read_all(kafka: KafkaEndpoint, topic: str, ends: list[int]) -> dict[int, list[bytes]]:
    consumer = Consumer(consumer_config(kafka.bootstrap, kafka.flavor, group_id="read"))
    values: dict[int, list[bytes]] = defaultdict(list)
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        for _ in range(200):
            if all(len(values[p]) >= ends[p] for p in range(PARTITIONS)):
                break
            for message in consumer.consume(1000, 0.5):
                partition = message.partition()
                if message.error() is None and partition is not None:
                    values[partition].append(bytes(message.value() or b""))
        return values
    finally:
        consumer.close()


@settings(
    max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches=st.lists(st.integers(min_value=1, max_value=400), min_size=1, max_size=4))
def test_after_every_publish_each_partitions_end_offset_is_exact(
    kafka: KafkaEndpoint, batches: list[int]
) -> None:
    topic = f"publisher.ends.{uuid.uuid4().hex[:8]}"
    publisher = KafkaPublisher(kafka.bootstrap, kafka.flavor, TopicSettings(PARTITIONS, 1, {}))
    published: dict[int, list[bytes]] = defaultdict(list)
    sequence = 0
    try:
        for size in batches:
            batch = []
            for _ in range(size):
                key = json.dumps({"id": sequence % 97}).encode()  # keys repeat: order matters
                value = json.dumps({"n": sequence}).encode()
                batch.append(Record(topic, key, value))
                published[partition_for(key, PARTITIONS)].append(value)
                sequence += 1
            publisher.publish_batch(batch)
            assert end_offsets(kafka, topic) == [len(published[p]) for p in range(PARTITIONS)]
    finally:
        publisher.close()
    ends = end_offsets(kafka, topic)
    assert read_all(kafka, topic, ends) == published  # where Java puts them, in order


@settings(
    max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(keys=st.lists(st.binary(min_size=1, max_size=64), min_size=1, max_size=200))
def test_partition_for_is_librdkafkas_murmur2(kafka: KafkaEndpoint, keys: list[bytes]) -> None:
    topic = f"publisher.murmur2.{uuid.uuid4().hex[:8]}"
    count = 7
    KafkaPublisher(kafka.bootstrap, kafka.flavor, TopicSettings(count, 1, {}))._ensure_topics(
        [topic]
    )
    landed: list[tuple[bytes | None, int | None]] = []
    producer = Producer(
        producer_config(kafka.bootstrap, kafka.flavor, partitioner="murmur2_random")
    )
    for key in keys:
        producer.produce(
            topic,
            key=key,
            value=b"v",
            on_delivery=lambda err, msg: landed.append((msg.key(), msg.partition())),
        )
    assert producer.flush(30) == 0
    assert sorted(landed) == sorted((key, partition_for(key, count)) for key in keys)
