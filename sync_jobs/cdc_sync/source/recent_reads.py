"""One broker read of a range for every consumer of an application.

Each consumer of the log (job.consumers) plans its own micro-batches, yet in one application
their ranges mostly coincide: the same new records, asked for by every consumer within a second
or two. The driver reads a small batch's ranges itself (job.batch_phases.DriverPhases); through
`RecentReads` the first consumer to ask for a range reads it from the broker, together with
what the broker already holds past it (read ahead, never waited for), and the others take the
records from memory. On a broker whose reads cost in proportion to its log (the Tansu
stand-in), four consumers otherwise asked it four times for every record.

What is kept: per topic-partition one window ``[start, end)`` holding every record the broker
had in it (gaps from compaction and transaction markers included, as gaps), extended forward
by later reads and trimmed from its oldest records within a byte budget shared by all
partitions (the least recently used partition goes first). A range the window does not hold
from its start (a consumer far behind the others) is read from the broker and not kept, so a
laggard never evicts what the others share.

Records at an offset never change while their topic lives; a topic deleted and re-created
under its name reuses offsets, so a partition the planner rebased is forgotten (`forget`). A
read the broker could not serve whole (retention, failOnDataLoss=false) is not kept.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from cdc_sync.source.offsets import PartitionRange, TopicPartition
from cdc_sync.source.options import KafkaSourceOptions
from cdc_sync.source.python_kafka import ARROW_SCHEMA, Reach, read_range_arrow

# Records read past a range's end when the broker holds them already: a driver batch's size.
READ_AHEAD = 2_000
BUDGET_BYTES = 64 * 1024 * 1024
# A window's chunks (one a read that extended it) before they are combined into one.
MAX_CHUNKS = 32
# A window nobody read or extended for this long is dropped: a topic deleted and re-created
# under its name reuses offsets, and a consumer coming back to it must read the new records.
IDLE_SECONDS = 60.0

# (options, span, ahead, reach) -> the span's records, then up to `ahead` more; `reach.end`
# set to how far the read got (source.python_kafka.read_range_arrow).
RangeReader = Callable[[KafkaSourceOptions, PartitionRange, int, Reach], Iterable[pa.RecordBatch]]
# What a window belongs to: the broker and consumer settings, then the partition.
WindowKey = tuple[str, tuple[tuple[str, str], ...], str, int]


@dataclass
class _Window:
    start: int
    end: int
    records: pa.Table  # ARROW_SCHEMA, in offset order
    at: float = field(default_factory=time.monotonic)  # when it was read or extended
    # Derived from `records` once, not per read: each extension adds a chunk, and Arrow's
    # `nbytes` and a filtered slice cost in proportion to the chunks and rows (a window of
    # 100,000 records in 2,001 chunks: 72 ms and 8 ms; summed over every window under the
    # guard, per read, they grew with the log).
    offsets: np.ndarray = field(init=False, repr=False)  # ascending: slices by binary search
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        if self.records.column("offset").num_chunks > MAX_CHUNKS:
            self.records = self.records.combine_chunks()
        self.offsets = self.records.column("offset").to_numpy()
        self.nbytes = self.records.nbytes

    def holds(self, span: PartitionRange) -> bool:
        return self.start <= span.start and span.end <= self.end

    def slice(self, start: int, end: int) -> pa.Table:
        first, stop = np.searchsorted(self.offsets, (start, end))
        return self.records.slice(first, stop - first)


@dataclass
class ReadCounts:
    """What the reads of this process did (read by the tests)."""

    from_broker: int = 0  # ranges (or their unread tails) read from the broker
    from_memory: int = 0  # ranges served whole from a window


class RecentReads:
    """Ranges of recent records, shared by every consumer of this process (thread-safe:
    each streaming query's `foreachBatch` runs on a thread of its own)."""

    def __init__(
        self,
        read: RangeReader = read_range_arrow,
        budget_bytes: int = BUDGET_BYTES,
        ahead: int = READ_AHEAD,
        idle_seconds: float = IDLE_SECONDS,
    ) -> None:
        self._read = read
        self.budget_bytes = budget_bytes
        self.ahead = ahead
        self.idle_seconds = idle_seconds
        self.counts = ReadCounts()
        self._windows: OrderedDict[WindowKey, _Window] = OrderedDict()  # least recent first
        self._guard = threading.Lock()  # the dicts and counts
        self._partition_locks: dict[WindowKey, threading.Lock] = {}

    def read(self, options: KafkaSourceOptions, span: PartitionRange) -> Iterator[pa.RecordBatch]:
        """The records of ``span``, in offset order, as `read_range_arrow` gives them."""
        key = _key(options, span.topic, span.partition)
        with self._lock_of(key):
            records = self._records(options, key, span)
        yield from records.to_batches()

    def forget(self, options: KafkaSourceOptions, partitions: Iterable[TopicPartition]) -> None:
        """Drop what is held of these partitions (their topic was re-created). Under each
        partition's lock: a read in flight would otherwise keep its window after this."""
        for topic, partition in partitions:
            key = _key(options, topic, partition)
            with self._lock_of(key), self._guard:
                self._windows.pop(key, None)

    def held_bytes(self) -> int:
        with self._guard:
            return sum(window.nbytes for window in self._windows.values())

    def held_chunks(self) -> int:
        with self._guard:
            return sum(
                window.records.column("offset").num_chunks for window in self._windows.values()
            )

    def _lock_of(self, key: WindowKey) -> threading.Lock:
        with self._guard:
            return self._partition_locks.setdefault(key, threading.Lock())

    def _records(
        self, options: KafkaSourceOptions, key: WindowKey, span: PartitionRange
    ) -> pa.Table:
        with self._guard:
            window = self._windows.get(key)
            if window is not None and time.monotonic() - window.at > self.idle_seconds:
                del self._windows[key]  # not read for long: the topic may be new since
                window = None
            held = window is not None and window.holds(span)
            if held:
                self.counts.from_memory += 1
                self._windows.move_to_end(key)
        if held:
            assert window is not None
            return window.slice(span.start, span.end)
        if window is not None and span.start < window.start:
            return self._from_broker(options, span, ahead=0)[0]  # a laggard reads for itself
        if window is not None and span.start <= window.end:
            tail = PartitionRange(span.topic, span.partition, window.end, span.end)
            read, reach = self._from_broker(options, tail, self.ahead)
            if reach < tail.end:
                return pa.concat_tables([window.slice(span.start, window.end), read])
            window = _Window(window.start, reach, pa.concat_tables([window.records, read]))
        else:
            read, reach = self._from_broker(options, span, self.ahead)
            if reach < span.end:
                return read
            window = _Window(span.start, reach, read)
        self._keep(key, window)
        return window.slice(span.start, span.end)

    def _from_broker(
        self, options: KafkaSourceOptions, span: PartitionRange, ahead: int
    ) -> tuple[pa.Table, int]:
        """The span's records and up to `ahead` the broker held past them; how far the read
        got (below the span's end: not whole, not to be kept)."""
        reach = Reach(span.start)
        batches = list(self._read(options, span, ahead, reach))
        with self._guard:
            self.counts.from_broker += 1
        return pa.Table.from_batches(batches, schema=ARROW_SCHEMA), reach.end

    def _keep(self, key: WindowKey, window: _Window) -> None:
        with self._guard:
            self._windows[key] = window
            self._windows.move_to_end(key)
            held = sum(w.nbytes for w in self._windows.values())
            while held > self.budget_bytes and len(self._windows) > 1:
                _, dropped = self._windows.popitem(last=False)
                held -= dropped.nbytes
            if held > self.budget_bytes:
                self._windows[key] = _trimmed(window, self.budget_bytes)


def _trimmed(window: _Window, budget_bytes: int) -> _Window:
    """The window without its oldest records, down to about half the budget (so that the
    next reads do not trim again at once)."""
    rows = window.records.num_rows
    keep = max(1, int(rows * (budget_bytes / 2) / max(1, window.nbytes)))
    if keep >= rows:
        return window
    kept = window.records.slice(rows - keep)
    first_dropped_after = int(window.offsets[rows - keep - 1]) + 1
    return _Window(first_dropped_after, window.end, kept, window.at)


def _key(options: KafkaSourceOptions, topic: str, partition: int) -> WindowKey:
    return (options.bootstrap, options.consumer_overrides, topic, partition)


# The driver process's reads: every consumer of the application goes through it.
SHARED = RecentReads()
