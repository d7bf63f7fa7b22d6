"""Dead-letter topic: records that could not be parsed or applied, nothing lost.

Kafka Connect's DLQ shape: the original key and value bytes, and the reason in headers
(`cdc_sync.*`): source coordinates, sink, stage, error class and message (no row payloads).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException, Producer

from cdc_sync.core.kafka_clients import producer_config
from cdc_sync.core.model import Coordinates

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeadLetter:
    coordinates: Coordinates
    sink: str  # "parse" when no sink was involved
    stage: str  # parse | route | write
    error_class: str
    message: str
    key: bytes | None
    value: bytes | None

    def headers(self) -> list[tuple[str, str | bytes | None]]:
        fields = {
            "topic": self.coordinates.topic,
            "partition": str(self.coordinates.partition),
            "offset": str(self.coordinates.offset),
            "sink": self.sink,
            "stage": self.stage,
            "error.class": self.error_class,
            "error.message": self.message,
        }
        return [(f"cdc_sync.{name}", value.encode()) for name, value in fields.items()]


class DeadLetterWriter:
    def __init__(self, bootstrap: str, flavor: str, topic: str) -> None:
        self.topic = topic
        self._producer = Producer(producer_config(bootstrap, flavor))
        self.written = 0

    def write(self, letters: list[DeadLetter]) -> None:
        """Produce and flush; raises if any record was not acknowledged (the batch re-runs)."""
        errors: list[Any] = []

        def on_delivery(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(err)

        for letter in letters:
            log.warning(
                "dead-letter %s sink=%s stage=%s error=%s",
                letter.coordinates,
                letter.sink,
                letter.stage,
                letter.error_class,
            )
            self._producer.produce(
                self.topic,
                key=letter.key,
                value=letter.value,
                headers=letter.headers(),
                on_delivery=on_delivery,
            )
            self._producer.poll(0)
        remaining = self._producer.flush(30)
        if errors or remaining:
            raise KafkaException(errors[0] if errors else f"{remaining} dead letters unflushed")
        self.written += len(letters)

    def close(self) -> None:
        self._producer.flush(10)
        self._producer.close()  # drop broker connections now, not at garbage collection
