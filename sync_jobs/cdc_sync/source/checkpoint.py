"""A micro-batch's end offsets, from the Spark checkpoint's offset log.

Spark writes `<checkpoint>/offsets/<batch id>` before it runs the batch: a version line (`v1`),
a metadata line, then one line per source holding that source's end offset, here the Kafka
offset JSON (`{"topic": {"0": 42}}`, the next offset to read). Unlike the offsets of the records
a batch read, it names every subscribed partition, idle ones included, and survives restarts.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from cdc_sync.source.offsets import PartitionOffsets, from_offset_json

log = logging.getLogger(__name__)

OFFSET_LOG = "offsets"


def batch_end_offsets(checkpoint_dir: Path, batch_id: int) -> PartitionOffsets | None:
    """The end offsets of batch `batch_id`; None when the log entry is missing or has a shape
    this reader does not know (callers then fall back to the offsets the batch read)."""
    path = checkpoint_dir / OFFSET_LOG / str(batch_id)
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    if len(lines) < 3 or lines[0] != "v1":
        log.debug("offset log %s: unknown layout", path)
        return None
    ends: PartitionOffsets = {}
    try:
        for line in lines[2:]:
            document = json.loads(line)
            if isinstance(document, dict):
                ends.update(from_offset_json(document))
    except (TypeError, ValueError):
        log.debug("offset log %s: not Kafka offset JSON", path)
        return None
    return ends
