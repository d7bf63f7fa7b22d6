"""Batch observer: advance the applied watermark (`job.watermark_rule`) and record it in every
sink, once every sink applied the batch and before Spark commits its offsets.

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

from cdc_sync.core.lsn import format_lsn
from cdc_sync.job.applier import BatchMetrics
from cdc_sync.job.watermark_rule import WatermarkRule
from cdc_sync.mapping import MappingFile
from cdc_sync.sinks.base import Sink
from cdc_sync.source.checkpoint import batch_end_offsets
from cdc_sync.source.offsets import PartitionOffsets

log = logging.getLogger(__name__)


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
        self.routes = {
            f"{mapping.topic_prefix}.{table}": route for table, route in mapping.tables.items()
        }
        self.rule = WatermarkRule()

    @property
    def watermark(self) -> int | None:
        """The applied watermark (a WAL position) this job last recorded; None before one."""
        return self.rule.watermark

    def __call__(self, metrics: BatchMetrics) -> None:
        candidate = metrics.commit_bound
        broker = (
            self._broker_ends() if candidate is not None and self.rule.advances(candidate) else None
        )
        advanced = self.rule.observe(candidate, self._processed(metrics), broker)
        if advanced is None:
            return
        for sink in self.sinks:
            sink.record_watermark(self.routes, advanced)
        log.debug("batch %d: applied watermark %s", metrics.batch_id, format_lsn(advanced))

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
            # Skipping one candidate only delays the watermark; failing the batch would stop
            # the sync over a bookkeeping read.
            log.warning("end offsets unavailable (%s): watermark candidate skipped", exc)
            return None

    def close(self) -> None:
        self.end_offsets.close()
