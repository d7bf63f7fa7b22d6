"""The ranges of one small micro-batch, read together by the driver (`job.batch_phases`).

A Spark task reads its one range with a consumer of its own (`python_kafka.consume_range`).
The driver reads every range of a small batch, a few partitions of a few dozen records at 20
changes/s; range by range, each paid a consumer, a connection, a metadata request, a
watermark pair (two ListOffsets) and a fetch of its own, and the batch paid them one after
the other. Here one consumer is assigned every range at once (a single `assign`: the stall of
a consumer re-assigned from range to range, behind its previous long-polling fetch, cannot
happen) and their watermarks are read in two requests, so a batch costs one connection, one
metadata request, two ListOffsets and fetches that hold every partition.

The checks are those of a task's read: a range's start outside the broker's watermarks now
fails or is skipped past (`checked_span`, failOnDataLoss); the end is reached by a message at
or past it or by the partition-EOF event at or past it; a range with no progress for the fetch
timeout fails naming its partition and offset.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from confluent_kafka import Consumer, KafkaError, KafkaException, Message
from confluent_kafka import TopicPartition as KafkaTopicPartition

from cdc_sync.source.data_loss import checked_span
from cdc_sync.source.end_offsets import EARLIEST, LATEST, listed_offsets
from cdc_sync.source.offsets import PartitionRange, TopicPartition
from cdc_sync.source.options import SOURCE_NAME, KafkaSourceOptions
from cdc_sync.source.python_kafka import (
    MESSAGES_PER_POLL,
    METADATA_TIMEOUT_S,
    POLL_TIMEOUT_S,
    KafkaRangeUnreachable,
    message_offset,
    range_consumer,
)

log = logging.getLogger(__name__)


def consume_ranges(
    options: KafkaSourceOptions, spans: Sequence[PartitionRange]
) -> dict[TopicPartition, list[Message]]:
    """Per range's partition, its messages of ``[start, end)`` in offset order (one range a
    partition, as a batch plans them)."""
    read: dict[TopicPartition, list[Message]] = {(s.topic, s.partition): [] for s in spans}
    if len(read) != len(spans):
        raise ValueError(f"{SOURCE_NAME}: one range a partition, got {list(spans)}")
    if not spans:
        return read
    consumer = range_consumer(options)
    try:
        partitions = list(read)
        lows = listed_offsets(consumer, partitions, EARLIEST, METADATA_TIMEOUT_S)
        highs = listed_offsets(consumer, partitions, LATEST, METADATA_TIMEOUT_S)
        pending: dict[TopicPartition, PartitionRange] = {}
        for span in spans:
            tp = (span.topic, span.partition)
            checked = checked_span(
                span, (lows[tp], highs[tp]), fail_on_data_loss=options.fail_on_data_loss
            )
            if checked.size > 0:
                pending[tp] = checked
        if not pending:
            return read
        consumer.assign([KafkaTopicPartition(t, p, span.start) for (t, p), span in pending.items()])
        _consume(consumer, pending, read, options.fetch_timeout_ms)
        return read
    finally:
        consumer.close()


def _consume(
    consumer: Consumer,
    pending: dict[TopicPartition, PartitionRange],
    read: dict[TopicPartition, list[Message]],
    timeout_ms: int,
) -> None:
    """Until every pending range reached its end. Each `consume` asks for no more messages
    than the ranges still need, so it returns as soon as they arrived (never waiting out its
    timeout while they are there); messages past a range's end are dropped."""
    next_offset = {tp: span.start for tp, span in pending.items()}
    deadline = time.monotonic() + timeout_ms / 1000
    while pending:
        if time.monotonic() > deadline:
            stuck = next(iter(pending))
            raise KafkaRangeUnreachable(pending[stuck], next_offset[stuck], timeout_ms)
        wanted = min(MESSAGES_PER_POLL, sum(s.end - next_offset[tp] for tp, s in pending.items()))
        for message in consumer.consume(num_messages=wanted, timeout=POLL_TIMEOUT_S):
            where = (message.topic(), message.partition())
            error = message.error()
            if error is not None and error.code() != KafkaError._PARTITION_EOF:
                if error.fatal():
                    raise KafkaException(error)
                # Transient (broker restart, leader move): the deadline bounds retrying.
                log.warning("%s: topic %s partition %s: %s", SOURCE_NAME, *where, error.str())
                continue
            tp = (str(where[0]), int(where[1] or 0))
            planned = pending.get(tp)
            if planned is None:  # a range already read to its end
                continue
            offset = message_offset(message)
            if error is None and next_offset[tp] <= offset < planned.end:
                read[tp].append(message)
                offset += 1
            if offset > next_offset[tp]:  # progress: the timeout starts again
                next_offset[tp] = offset
                deadline = time.monotonic() + timeout_ms / 1000
            if next_offset[tp] >= planned.end:
                del pending[tp]
