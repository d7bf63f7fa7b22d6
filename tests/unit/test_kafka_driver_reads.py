"""The driver's read of a small batch: every range through one consumer, assigned once.

A recording consumer (no broker) holds a few partitions, some with gaps (compaction), and
hands out their messages interleaved as a fetch of several partitions does."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError

from cdc_sync.source import python_kafka
from cdc_sync.source.data_loss import DataLossError
from cdc_sync.source.driver_reads import consume_ranges
from cdc_sync.source.end_offsets import EARLIEST
from cdc_sync.source.offsets import PartitionRange
from cdc_sync.source.options import parse_options

pytestmark = pytest.mark.unit

EOF_CODE = KafkaError._PARTITION_EOF


@dataclass
class Message:
    where: tuple[str, int]
    at: int
    eof: bool = False

    def topic(self) -> str:
        return self.where[0]

    def partition(self) -> int:
        return self.where[1]

    def offset(self) -> int:
        return self.at

    def error(self) -> Any:
        return SimpleNamespace(code=lambda: EOF_CODE) if self.eof else None


@dataclass
class Broker:
    """Per partition, the offsets it holds (gaps allowed) and its (low, high) watermarks."""

    logs: dict[tuple[str, int], list[int]]
    watermarks: dict[tuple[str, int], tuple[int, int]]
    assigned: list[list[tuple[str, int, int]]] = field(default_factory=list)
    asked: list[int] = field(default_factory=list)
    listed: list[int] = field(default_factory=list)  # ListOffsets requests: EARLIEST / LATEST
    positions: dict[tuple[str, int], int] = field(default_factory=dict)
    closed: bool = False

    def offsets_for_times(self, partitions: list[Any], timeout: float) -> list[Any]:
        self.listed.append(partitions[0].offset)
        return [
            SimpleNamespace(
                topic=tp.topic,
                partition=tp.partition,
                offset=self.watermarks[(tp.topic, tp.partition)][tp.offset != EARLIEST],
                error=None,
            )
            for tp in partitions
        ]

    def assign(self, partitions: list[Any]) -> None:
        self.assigned.append([(tp.topic, tp.partition, tp.offset) for tp in partitions])
        self.positions = {(tp.topic, tp.partition): tp.offset for tp in partitions}

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        """Round-robin over the assigned partitions, one message each in turn; an EOF event
        when a partition's position passes its last record."""
        self.asked.append(num_messages)
        out: list[Message] = []
        while len(out) < num_messages:
            moved = False
            for tp, position in list(self.positions.items()):
                if len(out) >= num_messages:
                    break
                later = [at for at in self.logs[tp] if at >= position]
                if later:
                    out.append(Message(tp, later[0]))
                    self.positions[tp] = later[0] + 1
                    moved = True
                elif position <= self.watermarks[tp][1]:
                    out.append(Message(tp, self.watermarks[tp][1], eof=True))
                    self.positions[tp] = self.watermarks[tp][1] + 1
                    moved = True
            if not moved:
                break
        return out

    def close(self) -> None:
        self.closed = True


def reading(monkeypatch: pytest.MonkeyPatch, broker: Broker, **options: str) -> Any:
    monkeypatch.setattr(python_kafka, "_consumer", lambda *_, **__: broker)
    raw = {"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "a,b", **options}
    parsed = parse_options(raw)
    return lambda spans: {
        tp: [m.offset() for m in messages] for tp, messages in consume_ranges(parsed, spans).items()
    }


def test_every_range_is_read_through_one_assignment_and_two_offset_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broker = Broker(
        logs={("a", 0): list(range(100)), ("b", 0): [0, 1, 2, 5, 6], ("b", 1): [0, 1, 2, 3]},
        watermarks={("a", 0): (0, 100), ("b", 0): (0, 9), ("b", 1): (0, 4)},
    )
    read = reading(monkeypatch, broker)
    spans = [
        PartitionRange("a", 0, 40, 60),
        PartitionRange("b", 0, 2, 9),  # its last records were compacted away: EOF ends it
        PartitionRange("b", 1, 1, 3),  # records past its end are left
    ]
    assert read(spans) == {
        ("a", 0): list(range(40, 60)),
        ("b", 0): [2, 5, 6],
        ("b", 1): [1, 2],
    }
    assert broker.assigned == [[("a", 0, 40), ("b", 0, 2), ("b", 1, 1)]]
    assert len(broker.listed) == 2
    assert broker.asked[0] == 20 + 7 + 2  # never more than the ranges still need
    assert broker.closed


def test_a_range_past_the_partition_s_end_fails_or_is_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    logs = {("a", 0): [0, 1, 2], ("b", 0): [0, 1, 2, 3]}
    marks = {("a", 0): (0, 3), ("b", 0): (0, 4)}
    spans = [PartitionRange("a", 0, 10, 12), PartitionRange("b", 0, 1, 4)]
    with pytest.raises(DataLossError, match="topic 'a' partition 0: checkpoint offset 10"):
        reading(monkeypatch, Broker(logs, marks))(spans)
    broker = Broker(logs, marks)
    assert reading(monkeypatch, broker, failOnDataLoss="false")(spans) == {
        ("a", 0): [],
        ("b", 0): [1, 2, 3],
    }
    assert broker.assigned == [[("b", 0, 1)]]


def test_a_range_below_the_retained_offsets_starts_at_them_when_told_to_continue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broker = Broker({("a", 0): [7, 8, 9]}, {("a", 0): (7, 10)})
    read = reading(monkeypatch, broker, failOnDataLoss="false")
    assert read([PartitionRange("a", 0, 4, 10)]) == {("a", 0): [7, 8, 9]}


def test_no_range_asks_nothing_and_empty_ranges_assign_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broker = Broker({("a", 0): [0]}, {("a", 0): (0, 1)})
    read = reading(monkeypatch, broker)
    assert read([]) == {}
    assert broker.listed == [] and broker.assigned == []
    assert read([PartitionRange("a", 0, 1, 1)]) == {("a", 0): []}
    assert broker.assigned == []
