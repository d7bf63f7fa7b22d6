"""``cdc_kafka``: a Spark 4 Python Data Source streaming Kafka topics through confluent-kafka.

Used where Spark's built-in kafka source (a jar) is not on the classpath. Output schema and
offset JSON are those of the built-in source, so the job downstream does not care which one
runs. Spark runs ``latestOffset``/``partitions`` in a long-lived driver-side Python worker and
``read`` in executor Python workers on a pickled copy of the reader.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Message
from confluent_kafka import TopicPartition as KafkaTopicPartition
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from cdc_sync.core.kafka_clients import consumer_config
from cdc_sync.core.relay import relay_logs
from cdc_sync.source.data_loss import (
    Watermarks,
    batch_ranges,
    carried_offsets,
    checked_span,
    checked_starts,
)
from cdc_sync.source.end_offsets import EARLIEST as EARLIEST_OFFSET
from cdc_sync.source.end_offsets import LATEST as LATEST_OFFSET
from cdc_sync.source.end_offsets import listed_offsets
from cdc_sync.source.offsets import (
    OffsetJson,
    PartitionOffsets,
    PartitionRange,
    TopicPartition,
    cap_oldest_first,
    cap_total,
    from_offset_json,
    to_offset_json,
)
from cdc_sync.source.options import (
    EARLIEST,
    LATEST,
    SOURCE_NAME,
    KafkaSourceOptions,
    parse_options,
)
from cdc_sync.source.shared_highs import SharedHighs

log = logging.getLogger(__name__)

KAFKA_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
)
# Python workers check a yielded RecordBatch against exactly this Arrow schema.
ARROW_SCHEMA = to_arrow_schema(KAFKA_SCHEMA, timezone="UTC")
ROWS_PER_ARROW_BATCH = 10_000
METADATA_TIMEOUT_S = 10.0
# `Consumer.consume` returns once it holds `num_messages` or after `timeout`: asking for no
# more than the range still needs returns as soon as the range is read. The timeout only runs
# out over gaps (compaction, transaction markers), so it is short.
MESSAGES_PER_POLL = 1000
POLL_TIMEOUT_S = 0.05
# Past the range's end only what the consumer holds already is read ahead: the records that
# came with the range's last fetch. (Waiting POLL_TIMEOUT_S there cost every read 50 ms.)
AHEAD_POLL_TIMEOUT_S = 0.001
# A read that gets nowhere from its start for this long asks for the watermarks
# (`consume_range`): above a busy broker's slowest first fetch seen here (0.64 s).
STALL_SECONDS = 1.0
# Reading each partition's next record for its timestamp (`head_times`): a fetch of one small
# batch, given up after this long (the batch is then shared proportionally).
HEAD_FETCH_BYTES = 64 * 1024
HEAD_TIMEOUT_S = 1.0
# The read that does not ask for watermarks is told a start outside them, not moved into them.
UNCHECKED_READ = {"enable.partition.eof": True, "auto.offset.reset": "error"}
OUT_OF_RANGE = (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE)


class KafkaPartitionRange(InputPartition):
    """One Spark task: read ``[start, end)`` of one topic-partition."""

    def __init__(self, span: PartitionRange) -> None:
        super().__init__(span)
        self.span = span


class KafkaRangeUnreachable(RuntimeError):
    """Records of a planned range did not arrive before the fetch timeout."""

    def __init__(self, span: PartitionRange, next_offset: int, timeout_ms: int) -> None:
        super().__init__(
            f"{SOURCE_NAME}: topic {span.topic!r} partition {span.partition}: offset "
            f"{next_offset} of planned range [{span.start}, {span.end}) not readable within "
            f"{timeout_ms} ms (option cdc.kafka.fetchTimeoutMs); was the topic deleted or "
            "truncated, or is the broker unreachable?"
        )
        self.span = span
        self.next_offset = next_offset


class CdcKafkaDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return KAFKA_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return CdcKafkaStreamReader(parse_options(self.options))


def _consumer(options: KafkaSourceOptions, **overrides: Any) -> Consumer:
    config = consumer_config(options.bootstrap, options.flavor, **overrides)
    config.update(dict(options.consumer_overrides))
    return Consumer(config)


class CdcKafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: KafkaSourceOptions) -> None:
        self.options = options
        relay_logs(options.log_relay)  # made in the planner's worker process
        self._metadata_consumer: Consumer | None = None
        self._head_consumer: Consumer | None = None
        self._shared_highs = SharedHighs(options.bootstrap, options.shared_highs_ms)
        # Set by prepareForTriggerAvailableNow: latestOffset never goes past it.
        self._available_now_target: PartitionOffsets | None = None
        # What latestOffset just read, for the calls Spark makes right after it in the same
        # trigger: reportLatestOffset (the high watermarks) and partitions (the watermarks it
        # planned the batch with, keyed by the batch's start and end).
        self._reported: PartitionOffsets | None = None
        self._planned: tuple[PartitionOffsets, PartitionOffsets, dict[TopicPartition, Watermarks]]
        self._planned = ({}, {}, {})
        # Topics the broker's last metadata listed with an error (their partitions unknown for
        # now): under failOnDataLoss=false they are not taken for deleted (`carried_offsets`).
        self._erroring: frozenset[str] = frozenset()

    # The driver-side consumer holds sockets and threads: never pickle it to executors.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_metadata_consumer"] = None
        state["_head_consumer"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        relay_logs(self.options.log_relay)  # unpickled in an executor's worker process

    @property
    def metadata_consumer(self) -> Consumer:
        if self._metadata_consumer is None:
            self._metadata_consumer = _consumer(self.options)
        return self._metadata_consumer

    # ---- driver side -------------------------------------------------------------------------

    def _partitions(self) -> list[TopicPartition]:
        metadata = self.metadata_consumer.list_topics(timeout=METADATA_TIMEOUT_S)
        found: list[TopicPartition] = []
        erroring = set()
        for topic_name, topic in metadata.topics.items():
            if not self.options.matches(topic_name):
                continue
            if topic.error is not None:
                erroring.add(topic_name)
                continue
            found.extend((topic_name, partition) for partition in topic.partitions)
        self._erroring = frozenset(erroring)
        return sorted(found)

    def _watermarks(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, Watermarks]:
        return _watermarks_from(self.metadata_consumer, partitions)

    def _latest(self, partitions: Sequence[TopicPartition]) -> PartitionOffsets:
        return listed_offsets(self.metadata_consumer, partitions, LATEST_OFFSET)

    def _high_watermarks(self) -> PartitionOffsets:
        return self._latest(self._partitions())

    def _planning_highs(self) -> PartitionOffsets:
        """The high watermarks to plan a batch with: as another consumer's planner asked for
        them a moment ago, when it did (source.shared_highs)."""
        return self._shared_highs.highs(self._partitions(), self._latest)

    def _planning_watermarks(self, begin: PartitionOffsets) -> dict[TopicPartition, Watermarks]:
        """Every partition's high watermark, in one request; its low one only where planning
        needs it: a partition new since `begin` starts there, and one past its end (topic
        re-created) fails or resumes there. A partition at or below its end is taken as held
        (its low set to its start): at its end nothing can be lost, and a range below it is
        checked against both watermarks before it is read, by `partitions` (the source's
        tasks) or `consume_range` (the driver's small batches). On the stand-in broker each
        ListOffsets costs in proportion to the partition's log, so this halves the planning's
        requests to the busiest partitions."""
        highs = self._planning_highs()
        unsure = [tp for tp, high in highs.items() if tp not in begin or begin[tp] > high]
        lows = listed_offsets(self.metadata_consumer, unsure, EARLIEST_OFFSET)
        return {
            tp: (lows[tp] if tp in lows else min(begin[tp], high), high)
            for tp, high in highs.items()
        }

    def initialOffset(self) -> OffsetJson:
        starting = self.options.starting
        marks = self._watermarks(self._partitions())
        if starting == "latest":
            return to_offset_json({tp: high for tp, (_, high) in marks.items()})
        if starting == "earliest":
            return to_offset_json({tp: low for tp, (low, _) in marks.items()})
        assert isinstance(starting, dict)
        initial: PartitionOffsets = {tp: low for tp, (low, _) in marks.items()}
        for tp, offset in starting.items():
            low, high = marks.get(tp, (0, 0))
            initial[tp] = low if offset == EARLIEST else high if offset == LATEST else offset
        return to_offset_json(initial)

    def latestOffset(
        self, start: Mapping[str, Mapping[str, int]] | None = None, limit: ReadLimit | None = None
    ) -> OffsetJson:
        # Defaults keep the pre-4.2 zero-argument call working; Spark 4.2 inspects the
        # signature and, seeing parameters, passes (start, limit) with admission control.
        if limit is None:
            limit = self.getDefaultReadLimit()
        begin = from_offset_json(start)
        marks = self._planning_watermarks(begin)
        self._reported = {tp: high for tp, (_, high) in marks.items()}
        # Fails (failOnDataLoss) or rebases partitions whose checkpoint offset the broker lost.
        starts = checked_starts(begin, marks, fail_on_data_loss=self.options.fail_on_data_loss)
        if self._available_now_target is not None:
            latest = dict(self._available_now_target)
        else:
            latest = {tp: high for tp, (_, high) in marks.items()}
        # Move no partition backwards except those rebased above (the partitions() of this
        # batch then reads them from their low watermark); which of the checkpoint's vanished
        # topics are kept: `carried_offsets`.
        end = carried_offsets(
            begin, marks.keys(), self._erroring, fail_on_data_loss=self.options.fail_on_data_loss
        )
        for tp, high in latest.items():
            end[tp] = max(high, starts.get(tp, 0))
        # Pre-4.2 calls carry no start, so there is nothing to cap against.
        if isinstance(limit, ReadMaxRows) and start is not None:
            end = {**end, **self._capped(starts, end, limit.max_rows)}
        self._planned = (begin, end, marks)
        return to_offset_json(end)

    def _capped(
        self, starts: PartitionOffsets, end: PartitionOffsets, max_rows: int
    ) -> PartitionOffsets:
        """The batch's ends under the cap, shared as `backlog_order` says. In time order the
        waiting partitions' next records are read for their timestamps: only when the backlog
        exceeds the cap, and not on noida, whose fetch returns a partition's whole rest
        (shared proportionally there, and wherever a timestamp does not come)."""
        if self.options.backlog_order != "time" or self.options.flavor == "noida":
            return cap_total(starts, end, max_rows)
        waiting = {tp: starts.get(tp, 0) for tp in end if end[tp] > starts.get(tp, 0)}
        if sum(end[tp] - start for tp, start in waiting.items()) <= max_rows:
            return cap_total(starts, end, max_rows)
        heads = head_times(self.head_consumer, waiting, HEAD_TIMEOUT_S)
        if heads.keys() != waiting.keys():
            log.info(
                "%s: no timestamp for %s within %.0f s: this batch shares its cap in proportion",
                SOURCE_NAME,
                sorted(waiting.keys() - heads.keys()),
                HEAD_TIMEOUT_S,
            )
            return cap_total(starts, end, max_rows)
        return cap_oldest_first(starts, end, max_rows, heads)

    @property
    def head_consumer(self) -> Consumer:
        if self._head_consumer is None:
            self._head_consumer = _consumer(
                self.options,
                **{"enable.partition.eof": True, "max.partition.fetch.bytes": HEAD_FETCH_BYTES},
            )
        return self._head_consumer

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> OffsetJson | None:
        # Spark calls this right after latestOffset, every trigger, only for its progress
        # report: the high watermarks that call read are as recent, and cost no request.
        reported, self._reported = self._reported, None
        return to_offset_json(reported if reported is not None else self._high_watermarks())

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now_target = self._high_watermarks()

    def partitions(
        self, start: Mapping[str, Mapping[str, int]], end: Mapping[str, Mapping[str, int]]
    ) -> Sequence[InputPartition]:
        begin, until = from_offset_json(start), from_offset_json(end)
        planned_begin, planned_end, marks = self._planned
        self._planned = ({}, {}, {})
        if (planned_begin, planned_end) != (begin, until):
            # Checked again here: after a restart Spark re-plans the uncommitted batch from
            # the checkpoint without calling latestOffset. Only partitions that move are
            # looked up. Otherwise latestOffset just planned this batch: its watermarks hold
            # (a moving partition's low one is checked when its range is read).
            moving = [tp for tp in self._partitions() if begin.get(tp) != until.get(tp)]
            marks = self._watermarks(moving)
        spans = batch_ranges(begin, until, marks, fail_on_data_loss=self.options.fail_on_data_loss)
        return [KafkaPartitionRange(span) for span in spans]

    def commit(self, end: Mapping[str, Mapping[str, int]]) -> None:
        # Nothing to do: Spark's checkpoint (offset log + commit log) is the source of truth
        # for progress; committing to a Kafka consumer group as well would create a second
        # truth that can disagree with the checkpoint after a failed batch is re-run.
        return None

    def stop(self) -> None:
        for consumer in (self._metadata_consumer, self._head_consumer):
            if consumer is not None:
                consumer.close()
        self._metadata_consumer = self._head_consumer = None

    # ---- executor side -----------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaPartitionRange)
        return read_range_arrow(self.options, partition.span)


def _watermarks_from(
    consumer: Consumer, partitions: Sequence[TopicPartition]
) -> dict[TopicPartition, Watermarks]:
    marks = {}
    for topic, partition in partitions:
        low, high = consumer.get_watermark_offsets(
            KafkaTopicPartition(topic, partition), timeout=METADATA_TIMEOUT_S, cached=False
        )
        marks[(topic, partition)] = (int(low), int(high))
    return marks


def head_times(
    consumer: Consumer, positions: Mapping[TopicPartition, int], timeout_s: float
) -> dict[TopicPartition, int]:
    """The timestamp (epoch ms) of each partition's first record at or after its position, as
    far as they arrive within `timeout_s`; a partition at its end, or whose record carries no
    timestamp, has none."""
    assigned = [KafkaTopicPartition(t, p, offset) for (t, p), offset in positions.items()]
    consumer.assign(assigned)
    found: dict[TopicPartition, int] = {}
    settled: set[TopicPartition] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while len(settled) < len(positions) and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=len(positions), timeout=0.05):
                where = (str(message.topic()), int(message.partition() or 0))
                if where in settled or where not in positions:
                    continue
                error = message.error()
                if error is not None and error.code() != KafkaError._PARTITION_EOF:
                    continue  # transient: the deadline bounds waiting
                settled.add(where)
                consumer.pause([KafkaTopicPartition(*where)])
                kind, millis = message.timestamp() if error is None else (0, 0)
                if kind:
                    found[where] = millis
    finally:
        # A pause outlives the assignment: the planner's next call would get nothing.
        consumer.resume(assigned)
        consumer.unassign()
    return found


def broker_watermarks(
    options: KafkaSourceOptions, partitions: Sequence[TopicPartition]
) -> dict[TopicPartition, Watermarks]:
    """The partitions' (low, high) watermarks now, through a consumer of their own (for the
    driver, outside the source's reader)."""
    consumer = _consumer(options)
    try:
        return _watermarks_from(consumer, partitions)
    finally:
        consumer.close()


class Reach:
    """How far a read got: every record below `end` (from the range's start) was delivered."""

    def __init__(self, end: int) -> None:
        self.end = end


def consume_range(
    options: KafkaSourceOptions,
    span: PartitionRange,
    ahead: int = 0,
    reach: Reach | None = None,
) -> Iterator[Message]:
    """Messages of ``[start, end)`` in offset order, then up to ``ahead`` more past ``end``
    that the broker holds already (no waiting for them: the first empty poll past ``end``
    ends the read); ``reach.end`` tells how far the read got (job.batch_phases shares it).

    The read starts at once, without asking for the partition's watermarks: the planner
    checked the start against them moments before, and on the Tansu stand-in that request
    cost more than the fetch (benchmarks/probe_range_reads.py). Only a read that gets nowhere
    from its start (the broker answers "out of range", or nothing arrives for
    `STALL_SECONDS`: Tansu answers a fetch past a partition's end with nothing) is read again
    as `consume_checked_range` reads it.
    """
    consumer = _consumer(options, **UNCHECKED_READ)
    try:
        consumer.assign([KafkaTopicPartition(span.topic, span.partition, span.start)])
        reading = _messages(consumer, options, span, span.end + ahead, reach, STALL_SECONDS)
        if not (yield from reading):
            return
    finally:
        consumer.close()
    yield from consume_checked_range(options, span, ahead, reach)


def consume_checked_range(
    options: KafkaSourceOptions,
    span: PartitionRange,
    ahead: int = 0,
    reach: Reach | None = None,
) -> Iterator[Message]:
    """`consume_range`, the watermarks asked for first. A start outside them (retention, topic
    re-created since planning) fails or, with failOnDataLoss=false, is skipped past (see
    ``checked_span``); gaps inside the range (compaction, transaction markers) simply never
    arrive. Reaching ``end`` is detected by a message at or past it or by the partition-EOF
    event at or past it."""
    consumer = _consumer(options, **{"enable.partition.eof": True})
    try:
        low, high = consumer.get_watermark_offsets(
            KafkaTopicPartition(span.topic, span.partition),
            timeout=METADATA_TIMEOUT_S,
            cached=False,
        )
        planned = span
        span = checked_span(
            span, (int(low), int(high)), fail_on_data_loss=options.fail_on_data_loss
        )
        if span != planned:  # a range the broker lost part of is read as it stands, not shared
            ahead, reach = 0, None
        target = max(span.end, min(int(high), span.end + ahead))
        if target <= span.start:
            return
        consumer.assign([KafkaTopicPartition(span.topic, span.partition, span.start)])
        yield from _messages(consumer, options, span, target, reach)
    finally:
        consumer.close()


def _messages(
    consumer: Consumer,
    options: KafkaSourceOptions,
    span: PartitionRange,
    target: int,
    reach: Reach | None,
    stall_seconds: float | None = None,
) -> Generator[Message, None, bool]:
    """The assigned consumer's messages from ``span.start`` up to ``target``. With
    `stall_seconds`, a read that gets nowhere from the start within it, or is told the start
    is out of range, returns True: to be checked against the watermarks (nothing was yielded)."""
    next_offset = span.start
    deadline = time.monotonic() + options.fetch_timeout_ms / 1000
    stalled = None if stall_seconds is None else time.monotonic() + stall_seconds
    while next_offset < target:
        now = time.monotonic()
        if stalled is not None and next_offset == span.start and now > stalled:
            return True
        if next_offset < span.end and now > deadline:
            raise KafkaRangeUnreachable(span, next_offset, options.fetch_timeout_ms)
        # Within the range ask for what it still needs (the call returns once it holds that
        # many); past its end for what is already here.
        if next_offset < span.end:
            wanted, timeout = span.end - next_offset, POLL_TIMEOUT_S
        else:
            wanted, timeout = target - next_offset, AHEAD_POLL_TIMEOUT_S
        wanted = min(MESSAGES_PER_POLL, wanted)
        messages = consumer.consume(num_messages=wanted, timeout=timeout)
        if not messages and next_offset >= span.end:
            break  # read ahead only what is there at once
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    next_offset = max(next_offset, _offset(message))
                    if next_offset >= span.end:
                        target = min(target, next_offset)  # the partition's end, for now
                    continue
                if stalled is not None and error.code() in OUT_OF_RANGE:
                    if next_offset == span.start:
                        return True
                    raise KafkaException(error)
                if error.fatal():
                    raise KafkaException(error)
                # Transient (broker restart, leader move): the deadline bounds retrying.
                log.warning(
                    "%s: topic %s partition %s offset %s: %s",
                    SOURCE_NAME,
                    span.topic,
                    span.partition,
                    next_offset,
                    error.str(),
                )
                continue
            offset = _offset(message)
            if offset >= target:
                next_offset = target
                break
            next_offset = offset + 1
            deadline = time.monotonic() + options.fetch_timeout_ms / 1000
            yield message
    if reach is not None:
        reach.end = next_offset
    return False


# How a range is read: `consume_range`, or `consume_checked_range` (benchmarks compare them).
RangeConsumer = Callable[[KafkaSourceOptions, PartitionRange, int, Reach | None], Iterator[Message]]


def _offset(message: Message) -> int:
    offset = message.offset()
    if offset is None:  # only for messages that carry no partition position
        raise KafkaException(f"{SOURCE_NAME}: message without offset from {message.topic()}")
    return offset


def _timestamp(message: Message) -> tuple[int | None, int]:
    """(epoch microseconds or None, Kafka timestampType id: 0 create, 1 log-append, -1 none)."""
    kind, millis = message.timestamp()
    # confluent-kafka numbers the types NOT_AVAILABLE=0, CREATE_TIME=1, LOG_APPEND_TIME=2.
    return (millis * 1000 if kind else None), kind - 1


def read_range_arrow(
    options: KafkaSourceOptions,
    span: PartitionRange,
    ahead: int = 0,
    reach: Reach | None = None,
    consume: RangeConsumer = consume_range,
) -> Iterator[pa.RecordBatch]:
    """The records of ``span`` as Arrow batches of the source's schema, as ``consume`` reads
    them (`consume_range`; ``ahead`` and ``reach`` as there)."""
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    offsets: list[int] = []
    timestamps: list[int | None] = []
    kinds: list[int] = []

    def flush() -> pa.RecordBatch:
        rows = len(offsets)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(keys, pa.binary()),
                pa.array(values, pa.binary()),
                pa.array([span.topic] * rows, pa.string()),
                pa.array([span.partition] * rows, pa.int32()),
                pa.array(offsets, pa.int64()),
                pa.array(timestamps, ARROW_SCHEMA.field("timestamp").type),
                pa.array(kinds, pa.int32()),
            ],
            schema=ARROW_SCHEMA,
        )
        for column in (keys, values, offsets, timestamps, kinds):
            column.clear()
        return batch

    for message in consume(options, span, ahead, reach):
        micros, kind = _timestamp(message)
        keys.append(message.key())
        values.append(message.value())
        offsets.append(_offset(message))
        timestamps.append(micros)
        kinds.append(kind)
        if len(offsets) >= ROWS_PER_ARROW_BATCH:
            yield flush()
    if offsets:
        yield flush()
