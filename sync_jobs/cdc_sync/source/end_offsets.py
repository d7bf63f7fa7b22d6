"""The broker's end offsets (high watermarks) of every partition of some topics, from the driver."""

from __future__ import annotations

from collections.abc import Sequence

from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as KafkaTopicPartition

from cdc_sync.core.kafka_clients import consumer_config
from cdc_sync.source.offsets import PartitionOffsets

TIMEOUT_SECONDS = 10.0


class EndOffsets:
    """One metadata consumer (no group membership, nothing committed), reused across calls."""

    def __init__(self, bootstrap: str, flavor: str) -> None:
        self.consumer = Consumer(
            consumer_config(bootstrap, flavor, group_id="cdc-sync-end-offsets")
        )

    def of(self, topics: Sequence[str]) -> PartitionOffsets:
        """Next offset the broker will write, per partition of `topics` (absent topics: none).
        Raises confluent_kafka.KafkaException when the broker does not answer in time."""
        wanted = set(topics)
        metadata = self.consumer.list_topics(timeout=TIMEOUT_SECONDS)
        ends: PartitionOffsets = {}
        for name, topic in metadata.topics.items():
            if name not in wanted or topic.error is not None:
                continue
            for partition in topic.partitions:
                _, high = self.consumer.get_watermark_offsets(
                    KafkaTopicPartition(name, partition), timeout=TIMEOUT_SECONDS, cached=False
                )
                ends[(name, partition)] = int(high)
        return ends

    def close(self) -> None:
        self.consumer.close()
