"""Checkpoint offsets the broker no longer holds: detect, then fail or continue (failOnDataLoss).

A partition's next offset from the checkpoint must lie within the broker's watermarks
``[low, high]``. Above ``high`` the topic was re-created or the broker reset; below ``low``
retention (or delete-records) removed records the job never read. Either way the stream would
otherwise read nothing (or skip silently), so by default the job fails, naming the partition,
the offsets and the way out. With ``failOnDataLoss=false`` it logs the same facts and continues
from the low watermark in both cases: after a re-creation the new records start again at the
low watermark (0), and continuing from the high watermark would skip every one of them.

The decision is pure (offsets and watermarks in, offsets or an error out); callers fetch the
watermarks.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from cdc_sync.source.offsets import (
    PartitionOffsets,
    PartitionRange,
    TopicPartition,
    ranges_between,
)
from cdc_sync.source.options import FAIL_ON_DATA_LOSS, SOURCE_NAME

log = logging.getLogger(__name__)

# (low, high): the first offset the broker still holds and the next offset it will write.
Watermarks = tuple[int, int]

WAY_OUT = (
    "Records between the checkpoint and the broker's offsets were never read. To go on, either "
    "start from a new checkpoint directory (`cdc-sync run --checkpoint NEW_DIR`, then "
    "`cdc-sync verify`), or set the source option "
    f"{FAIL_ON_DATA_LOSS}=false (`cdc-sync run --no-fail-on-data-loss`) to continue from the "
    "partition's low watermark."
)


@dataclass(frozen=True)
class LostOffset:
    """A partition whose checkpoint offset lies outside the broker's watermarks."""

    topic: str
    partition: int
    offset: int  # the checkpoint's next offset to read
    low: int
    high: int

    @property
    def past_end(self) -> bool:
        return self.offset > self.high

    @property
    def resume_at(self) -> int:
        """Where reading continues under failOnDataLoss=false: the low watermark, both ways."""
        return self.low

    def describe(self) -> str:
        where = (
            "past the partition's end (topic re-created or broker reset?)"
            if self.past_end
            else "below the earliest retained offset (records deleted by retention?)"
        )
        return (
            f"topic {self.topic!r} partition {self.partition}: checkpoint offset {self.offset} "
            f"is {where}; broker low watermark {self.low}, high watermark {self.high}"
        )


class DataLossError(RuntimeError):
    """The checkpoint points at offsets the broker no longer has (failOnDataLoss=true)."""

    def __init__(self, lost: list[LostOffset]) -> None:
        facts = "; ".join(item.describe() for item in lost)
        super().__init__(f"{SOURCE_NAME}: data loss: {facts}. {WAY_OUT}")
        self.lost = lost


@dataclass(frozen=True)
class StaleCheckpoint:
    """A checkpoint the broker's topics no longer match: topics it read that the broker does
    not have (deleted, or a broker reset: the stream idles on them without a word), and
    partitions whose checkpoint offset lies past their end (re-created: the first batch would
    fail, or under failOnDataLoss=false resume at the low watermark)."""

    missing: tuple[str, ...]
    ahead: tuple[tuple[TopicPartition, int, int], ...]  # (partition, checkpoint offset, end)

    def describe(self) -> str:
        parts = []
        if self.ahead:
            (topic, partition), offset, end = self.ahead[0]
            more = f", and {len(self.ahead) - 1} more partition(s)" if len(self.ahead) > 1 else ""
            parts.append(
                f"it is ahead of the topics' ends ({topic}[{partition}] at offset {offset}, the "
                f"broker's end {end}{more}): topics re-created or the broker reset"
            )
        if self.missing:
            parts.append(
                f"it read topics the broker does not have ({', '.join(self.missing)}): topics "
                "deleted or the broker reset"
            )
        return "; ".join(parts)


def stale_checkpoint(
    processed: Mapping[TopicPartition, int],
    ends: Mapping[TopicPartition, int],
    topics: Collection[str],
) -> StaleCheckpoint | None:
    """Whether the checkpoint's next offsets (`processed`) of `topics` still match the broker's
    end offsets (`ends`, every partition the broker lists of them); None when they do."""
    listed = {topic for topic, _ in ends}
    read = {tp: offset for tp, offset in processed.items() if tp[0] in topics}
    missing = tuple(sorted({topic for topic, _ in read} - listed))
    ahead = tuple(
        (tp, offset, ends[tp])
        for tp, offset in sorted(read.items())
        if offset > ends.get(tp, offset)
    )
    return StaleCheckpoint(missing, ahead) if missing or ahead else None


def carried_offsets(
    begin: Mapping[TopicPartition, int],
    listed: Collection[TopicPartition],
    erroring: Collection[str],
    *,
    fail_on_data_loss: bool,
) -> PartitionOffsets:
    """The checkpoint's offsets a batch's plan starts from. Strict: every one (a topic that
    vanished from the broker's metadata stops advancing and is checked when it is back).
    Under failOnDataLoss=false a topic the broker no longer lists is forgotten: its loss is
    accepted as a re-created topic's is, and when it exists again it is read from its low
    watermark like any topic new since the checkpoint (a table without rows gets no topic from
    a new snapshot; kept, its old offset would fail the next strict start as stale). A topic
    listed with an error (`erroring`: its partitions unknown for a moment) is kept, so a
    transient metadata error does not replay it from its start."""
    if fail_on_data_loss:
        return dict(begin)
    known = set(listed)
    return {tp: offset for tp, offset in begin.items() if tp in known or tp[0] in erroring}


def find_lost(
    start: Mapping[TopicPartition, int], marks: Mapping[TopicPartition, Watermarks]
) -> list[LostOffset]:
    """Partitions of ``start`` outside ``[low, high]``, in sorted order.

    A partition the broker does not list is not checked: a deleted topic just stops advancing
    until it exists again, and is checked then.
    """
    lost = []
    for (topic, partition), offset in sorted(start.items()):
        if (topic, partition) not in marks:
            continue
        low, high = marks[(topic, partition)]
        if offset < low or offset > high:
            lost.append(LostOffset(topic, partition, offset, low, high))
    return lost


def resolve_starts(
    start: Mapping[TopicPartition, int],
    marks: Mapping[TopicPartition, Watermarks],
    lost: list[LostOffset],
) -> PartitionOffsets:
    """Where each partition's reading starts: ``start``, lost partitions at their resume
    offset, and partitions new since ``start`` at their low watermark (the stream starts at
    "earliest" for topics it discovers; a new partition has no checkpoint to lose)."""
    resolved: PartitionOffsets = {tp: low for tp, (low, _) in marks.items()}
    resolved.update(start)
    resolved.update({(item.topic, item.partition): item.resume_at for item in lost})
    return resolved


def checked_starts(
    start: Mapping[TopicPartition, int],
    marks: Mapping[TopicPartition, Watermarks],
    *,
    fail_on_data_loss: bool,
) -> PartitionOffsets:
    """:func:`resolve_starts` after the data-loss check: raise, or warn and continue."""
    lost = find_lost(start, marks)
    if lost and fail_on_data_loss:
        raise DataLossError(lost)
    for item in lost:
        log.warning(
            "%s: %s=false: %s; continuing from offset %d",
            SOURCE_NAME,
            FAIL_ON_DATA_LOSS,
            item.describe(),
            item.resume_at,
        )
    return resolve_starts(start, marks, lost)


def batch_ranges(
    begin: Mapping[TopicPartition, int],
    until: Mapping[TopicPartition, int],
    marks: Mapping[TopicPartition, Watermarks],
    *,
    fail_on_data_loss: bool,
) -> list[PartitionRange]:
    """The ranges of a batch planned from ``begin`` to ``until``, by the rule its end was
    planned with: :func:`checked_starts` (fail, or continue a lost partition from its low
    watermark). One rule for the source's tasks (``partitions``) and for the driver's own
    reads of small batches (``job.batch_phases``), so a re-created topic is read from its
    start on both. ``marks``: the watermarks of at least every partition :func:`moved_back`
    names (the others are checked again when their range is read, ``checked_span``).

    Planning moves a partition backwards only when it rebased it, so such a partition starts at
    its low watermark even when the new topic has meanwhile grown past the old offset (the
    batch re-planned after a restart): from the old offset it would read nothing.
    """
    starts = checked_starts(begin, marks, fail_on_data_loss=fail_on_data_loss)
    for tp in moved_back(begin, until):
        if tp in marks:
            starts[tp] = min(starts[tp], marks[tp][0])
    return ranges_between(starts, until)


def moved_back(
    begin: Mapping[TopicPartition, int], until: Mapping[TopicPartition, int]
) -> list[TopicPartition]:
    """Partitions whose planned end lies below their start: rebased by planning."""
    return sorted(tp for tp, end in until.items() if tp in begin and end < begin[tp])


def checked_span(
    span: PartitionRange, marks: Watermarks, *, fail_on_data_loss: bool
) -> PartitionRange:
    """The part of a planned range still readable when its read starts.

    Planning checked the start already; this catches a reset or retention between planning
    and reading. Continuing skips a range past the end (the next batch's plan resumes at the
    low watermark) and starts a range below the low watermark at it.
    """
    tp = (span.topic, span.partition)
    start = checked_starts({tp: span.start}, {tp: marks}, fail_on_data_loss=fail_on_data_loss)[tp]
    if start == span.start:
        return span
    low, high = marks
    begin = span.end if span.start > high else min(low, span.end)
    return PartitionRange(span.topic, span.partition, begin, span.end)
