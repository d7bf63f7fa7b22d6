"""When a batch's candidate becomes the applied watermark (pure: offsets in, a position out).

The watermark W promises: every transaction whose commit record ends at or before W has been
applied by the sinks. A change's `commit_bound` c says Debezium streamed every such transaction
(for W = c) before that change. So c holds once the job has also applied every record Debezium
emitted before that change, in every partition of every subscribed topic; a batch may have been
capped (`maxOffsetsPerTrigger`) or planned before the producer finished, so that is not known
from the batch alone.

Rule: at the end of batch n take its candidate c_n and the broker's end offsets H_n(p) of all
subscribed partitions (read after the batch was applied). c_n becomes the watermark at the end
of the first batch (n itself or a later one) after which the processed end offsets reach H_n(p)
in every partition.

Assumption (documented in docs/internals.md): a record the job has read was produced after every
record the connector emitted before it is in the broker, by the time the batch holding it has
been applied and H_n is read. The embedded engine publishes a batch and waits for every
acknowledgement before the next; Kafka Connect's producer keeps order per partition and only a
produce retry can hold an earlier record of another partition back longer than that.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from cdc_sync.source.offsets import PartitionOffsets, TopicPartition

# Candidates waiting for their end offsets (one per batch while the job is behind). Dropping
# the oldest beyond this only delays the watermark: newer candidates are at least as high.
MAX_PENDING = 1000


@dataclass(frozen=True)
class Candidate:
    position: int
    ends: Mapping[TopicPartition, int]  # the broker's end offsets when it was taken


class WatermarkRule:
    def __init__(self) -> None:
        self.watermark: int | None = None
        self.processed: PartitionOffsets = {}  # next offset to read, per partition
        self.pending: deque[Candidate] = deque(maxlen=MAX_PENDING)

    def observe(
        self,
        candidate: int | None,
        processed_ends: Mapping[TopicPartition, int],
        broker_ends: Mapping[TopicPartition, int] | None,
    ) -> int | None:
        """One applied batch: its candidate, the offsets processed through it (next offset to
        read per partition) and the broker's end offsets read after it was applied (None when
        they could not be read: the candidate is dropped). Returns the new watermark when it
        advanced, else None."""
        for tp, end in processed_ends.items():
            self.processed[tp] = max(self.processed.get(tp, 0), end)
        if candidate is not None and broker_ends is not None and self.advances(candidate):
            self.pending.append(Candidate(candidate, dict(broker_ends)))
        held = [c.position for c in self.pending if self._reached(c.ends)]
        advanced = bool(held) and self.advances(max(held))
        if advanced:
            self.watermark = max(held)
        self.pending = deque(
            (c for c in self.pending if not self._reached(c.ends) and self.advances(c.position)),
            maxlen=MAX_PENDING,
        )
        return self.watermark if advanced else None

    def advances(self, position: int) -> bool:
        """Whether `position` is above the watermark (so worth a candidate)."""
        return self.watermark is None or position > self.watermark

    def _reached(self, ends: Mapping[TopicPartition, int]) -> bool:
        return all(self.processed.get(tp, 0) >= end for tp, end in ends.items())
