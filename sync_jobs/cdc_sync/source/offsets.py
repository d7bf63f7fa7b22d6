"""Kafka source offsets: JSON shape, per-partition ranges and read-limit spreading.

Pure functions only (no Kafka, no Spark) so the offset arithmetic is unit tested on its own.
An offset is the *next* offset to read per topic-partition, written as JSON in the shape of
Spark's built-in kafka source: ``{"topic": {"0": 42, "1": 7}}``. Partition keys are strings
because JSON object keys are; Spark compares offsets by their JSON text, so the serialised
form is canonical (topics and partitions sorted).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial

TopicPartition = tuple[str, int]
PartitionOffsets = dict[TopicPartition, int]
OffsetJson = dict[str, dict[str, int]]

# Of a batch read oldest first, the part every waiting partition has first (`cap_oldest_first`).
FLOOR_SHARE = 0.05


@dataclass(frozen=True)
class PartitionRange:
    """Offsets ``[start, end)`` of one topic-partition to read in one micro-batch."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


def to_offset_json(offsets: Mapping[TopicPartition, int]) -> OffsetJson:
    """Canonical dict form handed to Spark: topics sorted, partitions sorted numerically."""
    result: OffsetJson = {}
    for topic, partition in sorted(offsets):
        result.setdefault(topic, {})[str(partition)] = int(offsets[(topic, partition)])
    return result


def from_offset_json(offset: Mapping[str, Mapping[str, int]] | None) -> PartitionOffsets:
    """Inverse of :func:`to_offset_json`; accepts int or str partition keys."""
    parsed: PartitionOffsets = {}
    for topic, partitions in (offset or {}).items():
        if not isinstance(partitions, Mapping):
            raise ValueError(
                f"offset for topic {topic!r} must map partition -> offset, got {partitions!r}"
            )
        for partition, next_offset in partitions.items():
            parsed[(topic, int(partition))] = int(next_offset)
    return parsed


def dumps(offsets: Mapping[TopicPartition, int]) -> str:
    return json.dumps(to_offset_json(offsets))


def loads(text: str) -> PartitionOffsets:
    return from_offset_json(json.loads(text))


def ranges_between(
    start: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int]
) -> list[PartitionRange]:
    """Non-empty ``[start, end)`` ranges, one per topic-partition, in sorted order.

    A partition present in ``end`` but not in ``start`` is new since the previous batch (a new
    topic matched the pattern, or partitions were added): it is read from offset 0, and offsets
    the broker no longer holds are skipped at read time.
    """
    ranges = []
    for topic_partition in sorted(end):
        begin = start.get(topic_partition, 0)
        stop = end[topic_partition]
        if stop > begin:
            ranges.append(PartitionRange(topic_partition[0], topic_partition[1], begin, stop))
    return ranges


def cap_total(
    start: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    max_total: int,
) -> PartitionOffsets:
    """End offsets reading at most ``max_total`` records, spread across partitions.

    Each partition gets a share proportional to its backlog (as Spark's kafka source does);
    rounding leftovers go to the largest backlogs first so the cap is used fully and every
    partition with a backlog progresses when the cap allows it. Partitions absent from
    ``start`` count from offset 0.
    """
    if max_total <= 0:
        raise ValueError(f"maxOffsetsPerTrigger must be positive, got {max_total}")
    backlog = {tp: max(0, latest[tp] - start.get(tp, 0)) for tp in latest}
    total = sum(backlog.values())
    if total <= max_total:
        return dict(latest)
    share = {tp: (lag * max_total) // total for tp, lag in backlog.items()}
    leftover = max_total - sum(share.values())
    for tp in sorted(backlog, key=lambda tp: (-(backlog[tp] - share[tp]), tp)):
        if leftover == 0:
            break
        if backlog[tp] > share[tp]:
            share[tp] += 1
            leftover -= 1
    return {tp: start.get(tp, 0) + share[tp] if backlog[tp] else latest[tp] for tp in latest}


def cap_oldest_first(
    start: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    max_total: int,
    heads: Mapping[TopicPartition, int],
) -> PartitionOffsets:
    """End offsets reading at most ``max_total`` records, the log's oldest first: partitions in
    the order of their next record's timestamp (``heads``, epoch ms; ties by partition), each
    read up to its whole backlog while the cap lasts, after every waiting partition has had its
    floor (`FLOOR_SHARE` of the cap between them). A backlog is then read in about the order it
    was written: a snapshot's tables end one after another, each in an early batch, rather than
    all in the backlog's last (``cap_total``'s shares). The floor keeps every partition moving
    whatever its timestamps say (a producer's clock ahead of the others'), as long as the cap is
    at least the number of partitions waiting. Partitions without a head time (``heads`` lacks
    them) go last. Partitions absent from ``start`` count from offset 0.
    """
    if max_total <= 0:
        raise ValueError(f"maxOffsetsPerTrigger must be positive, got {max_total}")
    backlog = {tp: max(0, latest[tp] - start.get(tp, 0)) for tp in latest}
    if sum(backlog.values()) <= max_total:
        return dict(latest)
    end = {tp: latest[tp] if not lag else start.get(tp, 0) for tp, lag in backlog.items()}
    waiting = sorted((tp for tp, lag in backlog.items() if lag), key=partial(_oldest, heads))
    left = max_total
    for share in (oldest_first_floor(max_total, len(waiting)), max_total):
        for tp in waiting:
            taken = min(latest[tp] - end[tp], share, left)
            end[tp] += taken
            left -= taken
    return end


def oldest_first_floor(max_total: int, waiting: int) -> int:
    """What `cap_oldest_first` gives each of `waiting` partitions before the oldest go on."""
    return max(1, int(max_total * FLOOR_SHARE) // max(1, waiting))


def _oldest(
    heads: Mapping[TopicPartition, int], tp: TopicPartition
) -> tuple[int, int, TopicPartition]:
    return (0, heads[tp], tp) if tp in heads else (1, 0, tp)
