"""How a range is read: never wait on the poll timeout for records the range does not need.

`Consumer.consume(num_messages=N, timeout=T)` returns once it holds N messages or after T. The
reader once asked for 1,000 whatever the range held, so every task of every micro-batch waited
the whole timeout (0.5 s then) for records that were never coming: the floor of the job's
freshness. A recording consumer (no broker) shows what the reader asks for."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import KafkaError

from cdc_sync.source import python_kafka
from cdc_sync.source.data_loss import DataLossError
from cdc_sync.source.offsets import PartitionRange
from cdc_sync.source.options import parse_options

pytestmark = pytest.mark.unit


@dataclass
class Record:
    at: int
    where: tuple[str, int] = ("t", 0)

    def topic(self) -> str:
        return self.where[0]

    def partition(self) -> int:
        return self.where[1]

    def error(self) -> None:
        return None

    def offset(self) -> int:
        return self.at

    def key(self) -> bytes:
        return str(self.at).encode()

    def value(self) -> bytes:
        return b"v"

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)


@dataclass
class RecordingConsumer:
    """A partition holding offsets [0, high), handed out as consume() asks."""

    high: int
    asked: list[int] = field(default_factory=list)
    waited: list[float] = field(default_factory=list)  # each consume()'s timeout
    position: int = 0
    left_over: list[Record] = field(default_factory=list)  # fetched before the last assign
    closed: bool = False

    def get_watermark_offsets(self, *_: Any, **__: Any) -> tuple[int, int]:
        return (0, self.high)

    def assign(self, partitions: list[Any]) -> None:
        self.position = partitions[0].offset

    def consume(self, num_messages: int, timeout: float) -> list[Record]:
        self.asked.append(num_messages)
        self.waited.append(timeout)
        stale, self.left_over = self.left_over, []
        taken = list(range(self.position, min(self.high, self.position + num_messages)))
        self.position += len(taken)
        return stale + [Record(at) for at in taken]

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize(("start", "end"), [(0, 1), (10, 310), (0, 2500)])
def test_the_reader_asks_for_no_more_records_than_the_range_still_needs(
    monkeypatch: pytest.MonkeyPatch, start: int, end: int
) -> None:
    consumer = RecordingConsumer(high=5000)  # more records wait past the range's end
    monkeypatch.setattr(python_kafka, "_consumer", lambda *_, **__: consumer)
    options = parse_options({"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t"})

    read = list(python_kafka.consume_range(options, PartitionRange("t", 0, start, end)))

    assert [message.offset() for message in read] == list(range(start, end))
    needed = end - start
    assert consumer.asked[0] == min(needed, python_kafka.MESSAGES_PER_POLL)
    assert sum(consumer.asked) == needed  # so no call waits out its timeout


@dataclass
class OutOfRange:
    """The error event of a read told its start is outside the partition's watermarks."""

    def code(self) -> int:
        return KafkaError._AUTO_OFFSET_RESET


@dataclass
class Refused(Record):
    def error(self) -> OutOfRange:  # type: ignore[override]
        return OutOfRange()


def test_a_read_starts_without_asking_for_watermarks_and_asks_only_when_told_out_of_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The planner checked the start moments ago: the read asks the broker for the range at
    once. A start the broker calls out of range is then checked against the watermarks (and
    here refused as data loss: the partition holds [0, 5))."""
    asked_watermarks: list[bool] = []

    class Consumer(RecordingConsumer):
        def get_watermark_offsets(self, *_: Any, **__: Any) -> tuple[int, int]:
            asked_watermarks.append(True)
            return (0, self.high)

    options = parse_options({"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t"})
    monkeypatch.setattr(python_kafka, "_consumer", lambda *_, **__: Consumer(high=50))
    read = list(python_kafka.consume_range(options, PartitionRange("t", 0, 10, 20)))
    assert [m.offset() for m in read] == list(range(10, 20))
    assert asked_watermarks == []

    refusing = Consumer(high=5, left_over=[Refused(10)])
    made = iter([refusing, Consumer(high=5)])
    monkeypatch.setattr(python_kafka, "_consumer", lambda *_, **__: next(made))
    with pytest.raises(DataLossError, match="'t'"):
        list(python_kafka.consume_range(options, PartitionRange("t", 0, 10, 20)))
    assert asked_watermarks == [True] and refusing.closed


def test_a_read_ahead_asks_for_the_range_first_then_takes_only_what_is_already_here(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Read ahead (the driver's shared reads) must not make the range's own poll wait for
    records past its end: asking for 1,000 once cost every read the whole 50 ms timeout."""
    consumer = RecordingConsumer(high=25)
    monkeypatch.setattr(python_kafka, "_consumer", lambda *_, **__: consumer)
    options = parse_options({"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t"})
    reach = python_kafka.Reach(0)

    read = list(python_kafka.consume_range(options, PartitionRange("t", 0, 0, 20), 2000, reach))

    assert [m.offset() for m in read] == list(range(25)) and reach.end == 25
    assert consumer.asked[0] == 20 and consumer.waited[0] == python_kafka.POLL_TIMEOUT_S
    assert set(consumer.waited[1:]) == {python_kafka.AHEAD_POLL_TIMEOUT_S}
