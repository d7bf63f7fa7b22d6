"""Batch observer: advance the applied watermark (`job.observe.watermark_rule`) and record it in
every sink, once every sink applied the batch. The rule and the writes run on a background thread
(`job.observe.watermark_writer`), so they never delay the next micro-batch.

What it records is a promise to applications (`cdc-sync wait`): every transaction whose commit
ends at or before the stored position is in that sink. Each sink keeps it per topic and only
raises it (`Sink.record_watermark`; read back by each sink's `readback.watermarks`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from confluent_kafka import KafkaException

from cdc_sync.job.observe.watermark_writer import Observation, WatermarkWriter
from cdc_sync.job.settle.applier import BatchMetrics
from cdc_sync.mapping import MappingFile
from cdc_sync.sinks.base import Sink
from cdc_sync.source.checkpoint import batch_end_offsets
from cdc_sync.source.offsets import PartitionOffsets

log = logging.getLogger(__name__)

# How long stopping the job waits for the last watermark write.
CLOSE_SECONDS = 10.0


class EndOffsetReader(Protocol):
    def of(self, topics: Sequence[str]) -> PartitionOffsets: ...
    def close(self) -> None: ...


class WatermarkObserver:
    def __init__(
        self,
        mapping: MappingFile,
        sinks: Sequence[Sink],
        end_offsets: EndOffsetReader,
        checkpoint_dir: Path | None,
    ) -> None:
        self.sinks = list(sinks)
        self.end_offsets = end_offsets
        self.checkpoint_dir = checkpoint_dir
        self.topics = mapping.topics()
        self.routes = {mapping.topic(table): route for table, route in mapping.tables.items()}
        self.writer = WatermarkWriter(self.sinks, self.routes, self._broker_ends)

    @property
    def watermark(self) -> int | None:
        """The applied watermark (a WAL position) this job last recorded in every sink; None
        before one. It trails the batches: `flush` waits for it."""
        return self.writer.recorded

    def __call__(self, metrics: BatchMetrics) -> None:
        # The processed offsets are taken now, from this batch's metrics and its offset log
        # entry (Spark purges old entries); the rest happens on the writer's thread.
        processed = self._processed(metrics)
        self.writer.submit(Observation(metrics.batch_id, metrics.commit_bound, processed))

    def flush(self, timeout_seconds: float) -> bool:
        """Wait until every batch observed so far is evaluated and the watermark it gave is
        recorded in every sink; False when `timeout_seconds` passed first."""
        return self.writer.flush(timeout_seconds)

    def _processed(self, metrics: BatchMetrics) -> PartitionOffsets:
        """Next offset to read per partition after this batch: the checkpoint's end offsets
        (every subscribed partition), else one past the highest offset the batch read."""
        processed = {tp: offset + 1 for tp, offset in metrics.offsets.items()}
        logged = (
            batch_end_offsets(self.checkpoint_dir, metrics.batch_id)
            if self.checkpoint_dir is not None
            else None
        )
        for tp, end in (logged or {}).items():
            processed[tp] = max(processed.get(tp, 0), end)
        return processed

    def _broker_ends(self) -> PartitionOffsets | None:
        try:
            return self.end_offsets.of(self.topics)
        except KafkaException as exc:
            # Skipping a candidate only delays the watermark; the sync goes on regardless.
            log.warning("end offsets unavailable (%s): watermark candidate skipped", exc)
            return None

    def close(self, timeout_seconds: float = CLOSE_SECONDS) -> None:
        """Record the pending watermark (bounded), stop the thread, close the end-offset reader.
        Call before the sinks close."""
        if self.writer.close(timeout_seconds):
            self.end_offsets.close()  # else the thread may still read it; it dies with the job
