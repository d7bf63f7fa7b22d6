"""One broker read of a range for every consumer of an application (source.recent_reads).

A partition stand-in (offsets with gaps, a high watermark that grows) plays the broker: the
tests check what every read returns against the partition's own records and count what was
asked of it. The read against a real broker is in tests/integration/test_kafka_source.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_sync.source.offsets import PartitionRange
from cdc_sync.source.options import KafkaSourceOptions
from cdc_sync.source.python_kafka import ARROW_SCHEMA, Reach
from cdc_sync.source.recent_reads import MAX_CHUNKS, RecentReads

pytestmark = pytest.mark.unit

OPTIONS = KafkaSourceOptions("127.0.0.1:1", "kafka", ("t",), None, "earliest", None, 1000)
TOPIC = "t"


@dataclass
class Partition:
    """Records at some offsets below `high` (the missing ones: compaction, markers)."""

    offsets: list[int] = field(default_factory=list)
    high: int = 0
    asked: list[tuple[int, int, int]] = field(default_factory=list)  # (start, end, ahead)
    slow_s: float = 0.0

    def append(self, count: int, gap: int = 0) -> None:
        self.high += gap
        self.offsets += range(self.high, self.high + count)
        self.high += count

    def value(self, offset: int) -> bytes:
        return f"v{offset}".encode()

    def read(
        self, options: KafkaSourceOptions, span: PartitionRange, ahead: int, reach: Reach
    ) -> Iterator[pa.RecordBatch]:
        self.asked.append((span.start, span.end, ahead))
        time.sleep(self.slow_s)
        until = max(span.end, min(self.high, span.end + ahead))
        taken = [o for o in self.offsets if span.start <= o < until]
        yield _batch(taken, self)
        reach.end = until

    def records(self, start: int, end: int) -> list[tuple[int, bytes]]:
        return [(o, self.value(o)) for o in self.offsets if start <= o < end]


def _batch(offsets: list[int], partition: Partition) -> pa.RecordBatch:
    rows = len(offsets)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([str(o).encode() for o in offsets], pa.binary()),
            pa.array([partition.value(o) for o in offsets], pa.binary()),
            pa.array([TOPIC] * rows, pa.string()),
            pa.array([0] * rows, pa.int32()),
            pa.array(offsets, pa.int64()),
            pa.array([None] * rows, ARROW_SCHEMA.field("timestamp").type),
            pa.array([0] * rows, pa.int32()),
        ],
        schema=ARROW_SCHEMA,
    )


def read(reads: RecentReads, start: int, end: int) -> list[tuple[int, bytes]]:
    rows = [
        row
        for batch in reads.read(OPTIONS, PartitionRange(TOPIC, 0, start, end))
        for row in batch.to_pylist()
    ]
    return [(row["offset"], row["value"]) for row in rows]


def test_consumers_asking_for_the_same_range_ask_the_broker_once() -> None:
    partition = Partition()
    partition.append(30)
    reads = RecentReads(partition.read)
    for _consumer in range(4):
        assert read(reads, 0, 30) == partition.records(0, 30)
    assert len(partition.asked) == 1
    assert (reads.counts.from_broker, reads.counts.from_memory) == (1, 3)


def test_a_read_takes_what_the_broker_holds_past_the_range_for_the_consumers_planning_later() -> (
    None
):
    partition = Partition()
    partition.append(10)
    reads = RecentReads(partition.read, ahead=100)
    assert read(reads, 0, 5) == partition.records(0, 5)  # planned before records 5-9 came
    assert read(reads, 0, 10) == partition.records(0, 10)
    assert partition.asked == [(0, 5, 100)]


def test_a_range_past_the_window_reads_only_its_unread_tail() -> None:
    partition = Partition()
    partition.append(10)
    reads = RecentReads(partition.read)
    read(reads, 0, 10)
    partition.append(5, gap=3)  # offsets 13-17; 10-12 are markers
    assert read(reads, 4, 18) == partition.records(4, 18)
    assert partition.asked[1][:2] == (10, 18)
    assert read(reads, 0, 18) == partition.records(0, 18)
    assert len(partition.asked) == 2


def test_a_consumer_far_behind_reads_for_itself_and_evicts_nothing() -> None:
    partition = Partition()
    partition.append(100)
    reads = RecentReads(partition.read)
    read(reads, 50, 100)
    assert read(reads, 0, 20) == partition.records(0, 20)
    assert partition.asked[1] == (0, 20, 0)  # no read ahead for a laggard
    assert read(reads, 50, 100) == partition.records(50, 100)
    assert len(partition.asked) == 2


def test_a_read_the_broker_could_not_serve_whole_is_not_kept() -> None:
    partition = Partition()
    partition.append(10)

    def cut_short(
        options: KafkaSourceOptions, span: PartitionRange, ahead: int, reach: Reach
    ) -> Iterator[pa.RecordBatch]:
        partition.asked.append((span.start, span.end, ahead))
        yield _batch([o for o in partition.offsets if 5 <= o < span.end], partition)
        # reach left at the span's start: the records below 5 were lost to retention

    reads = RecentReads(cut_short)
    assert read(reads, 0, 10) == partition.records(5, 10)
    read(reads, 0, 10)
    assert len(partition.asked) == 2


def test_a_window_nobody_read_for_long_is_dropped() -> None:
    partition = Partition()
    partition.append(10)
    reads = RecentReads(partition.read, idle_seconds=0.05)
    read(reads, 0, 10)
    time.sleep(0.1)
    read(reads, 0, 10)
    assert len(partition.asked) == 2


def test_a_forgotten_partition_is_read_again() -> None:
    partition = Partition()
    partition.append(10)
    reads = RecentReads(partition.read)
    read(reads, 0, 10)
    reads.forget(OPTIONS, [(TOPIC, 0)])
    read(reads, 0, 10)
    assert len(partition.asked) == 2


def test_a_partition_forgotten_while_a_read_is_in_flight_keeps_nothing_of_that_read() -> None:
    """The read began before planning found the topic re-created: what it brings back must
    not become the window the forget just dropped."""
    partition = Partition(slow_s=0.3)
    partition.append(10)
    reads = RecentReads(partition.read)
    reader = threading.Thread(target=read, args=(reads, 0, 10))
    reader.start()
    time.sleep(0.1)  # the read is at the broker
    reads.forget(OPTIONS, [(TOPIC, 0)])
    reader.join()
    partition.slow_s = 0.0
    read(reads, 0, 10)
    assert len(partition.asked) == 2


def test_what_is_kept_stays_within_the_budget() -> None:
    partition = Partition()
    partition.append(600)
    reads = RecentReads(partition.read, budget_bytes=6_000, ahead=0)
    for start in range(0, 600, 30):
        assert read(reads, start, start + 30) == partition.records(start, start + 30)
        assert reads.held_bytes() <= 6_000
    # What was trimmed is read from the broker, what was kept from memory: either way, whole.
    for start in range(600):
        assert read(reads, start, 600) == partition.records(start, 600)


def test_a_window_extended_read_after_read_stays_a_few_chunks() -> None:
    """Each read that extends a window adds an Arrow chunk, and what the window costs (its
    `nbytes`, a slice) grows with its chunks: they grew with every batch, to 72 ms a window
    summed per read at 2,001 chunks. Extended 500 times it holds at most `MAX_CHUNKS` chunks and
    still gives every range whole, gaps included."""
    partition = Partition()
    reads = RecentReads(partition.read, ahead=0)
    position = 0
    for step in range(500):
        partition.append(7, gap=step % 3)
        assert read(reads, position, partition.high) == partition.records(position, partition.high)
        position = partition.high
        assert reads.held_chunks() <= MAX_CHUNKS
    for start in range(0, partition.high, 97):
        end = min(start + 50, partition.high)
        assert read(reads, start, end) == partition.records(start, end)
    assert len(partition.asked) == 500  # every one of those from the window


def test_threads_asking_at_once_wait_for_one_read() -> None:
    partition = Partition(slow_s=0.2)
    partition.append(50)
    reads = RecentReads(partition.read)
    results: list[list[tuple[int, bytes]]] = []
    threads = [
        threading.Thread(target=lambda: results.append(read(reads, 0, 50))) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [partition.records(0, 50)] * 4
    assert len(partition.asked) == 1


# A step: records arrive (count, gap before them), or a consumer reads from its position up to
# `n` offsets on (at most to the high watermark), or jumps back or on by `n` (a batch on the
# executors, a restart), or the partition is forgotten.
Step = st.one_of(
    st.tuples(st.just("arrive"), st.integers(0, 3), st.integers(1, 40)),
    st.tuples(st.sampled_from(["read", "jump"]), st.integers(0, 3), st.integers(-60, 60)),
    st.tuples(st.just("forget"), st.just(0), st.just(0)),
)


@settings(max_examples=500, deadline=None)
@given(
    steps=st.lists(Step, max_size=80),
    budget=st.sampled_from([1_500, 6_000, 10**9]),
    ahead=st.sampled_from([0, 3, 2_000]),
)
def test_every_read_returns_exactly_the_records_of_its_range(
    steps: list[tuple[str, int, int]], budget: int, ahead: int
) -> None:
    """Four consumers at their own positions: whatever the windows hold, each read gives the
    partition's records of its range, no more, no fewer."""
    partition = Partition()
    reads = RecentReads(partition.read, budget_bytes=budget, ahead=ahead)
    positions = [0, 0, 0, 0]
    for kind, a, n in steps:
        if kind == "arrive":
            partition.append(n, gap=a)
        elif kind == "forget":
            reads.forget(OPTIONS, [(TOPIC, 0)])
        elif kind == "jump":
            positions[a] = min(partition.high, max(0, positions[a] + n))
        else:
            start = positions[a]
            end = min(partition.high, start + abs(n))
            assert read(reads, start, end) == partition.records(start, end)
            positions[a] = end
