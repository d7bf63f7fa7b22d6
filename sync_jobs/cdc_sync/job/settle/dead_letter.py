"""Dead-letter topic: records that could not be parsed or applied, nothing lost.

Kafka Connect's DLQ shape: the original key and value bytes, and the reason in headers
(`cdc_sync.*`): source coordinates, sink, stage, error class and message (no row payloads).

A batch whose dead letters were written can still fail afterwards (an observer, the process
killed before Spark commits its offsets) and re-run under the same batch id. The ledger beside
the checkpoint (`cdc_sync_dead_letters.json`) names the batch and the dead letters of it that
the broker acknowledged, so the re-run writes only the others. It is saved after the flush: a
crash between the two can still write a batch's dead letters twice.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException, Producer

from cdc_sync.core.files import write_atomically
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

    @property
    def identity(self) -> LetterId:
        """One record's dead letter for one sink and stage: written once."""
        where = self.coordinates
        return (where.topic, where.partition, where.offset, self.sink, self.stage)

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


LetterId = tuple[str, int, int, str, str]  # topic, partition, offset, sink, stage


class DeadLetterLedgerCorrupt(RuntimeError):
    """A ledger file that cannot be read; the message names the file."""


class DeadLetterLedger:
    """The dead letters written for the latest batch that had any, kept beside the checkpoint."""

    FILE_NAME = "cdc_sync_dead_letters.json"

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def beside_checkpoint(cls, checkpoint_dir: Path) -> DeadLetterLedger:
        return cls(checkpoint_dir / cls.FILE_NAME)

    def written(self, batch_id: int) -> set[LetterId]:
        """What was written for `batch_id` (nothing unless it is the batch last recorded)."""
        try:
            document = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return set()
        except ValueError as error:
            raise DeadLetterLedgerCorrupt(
                f"{self.path}: unreadable ({error}); delete it (a batch that re-runs may then "
                "write its dead letters again)"
            ) from error
        if document.get("batch") != batch_id:
            return set()
        return {(str(t), int(p), int(o), str(s), str(g)) for t, p, o, s, g in document["written"]}

    def record(self, batch_id: int, written: set[LetterId]) -> None:
        document = {"format": 1, "batch": batch_id, "written": sorted(written)}
        write_atomically(self.path, json.dumps(document) + "\n")


class DeadLetterWriter:
    def __init__(
        self, bootstrap: str, flavor: str, topic: str, ledger: DeadLetterLedger | None = None
    ) -> None:
        self.topic = topic
        self._producer = Producer(producer_config(bootstrap, flavor))
        self.ledger = ledger
        self.written = 0

    def write(self, letters: list[DeadLetter], batch_id: int | None = None) -> None:
        """Produce and flush; raises if any record was not acknowledged (the batch re-runs).
        With a ledger and `batch_id`, dead letters a failed run of the batch already wrote are
        left out."""
        done: set[LetterId] = set()
        if self.ledger is not None and batch_id is not None:
            done = self.ledger.written(batch_id)
            skipped = [letter for letter in letters if letter.identity in done]
            if skipped:
                log.info(
                    "batch %d re-runs: %d dead letter(s) already written", batch_id, len(skipped)
                )
            letters = [letter for letter in letters if letter.identity not in done]
        if not letters:
            return
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
        if self.ledger is not None and batch_id is not None:
            self.ledger.record(batch_id, done | {letter.identity for letter in letters})

    def close(self) -> None:
        self._producer.flush(10)
        self._producer.close()  # drop broker connections now, not at garbage collection
