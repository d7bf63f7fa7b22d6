"""What a streaming query's checkpoint holds (read-only; Spark owns the files).

Spark writes `<checkpoint>/metadata` when the query first starts (`{"id": "<uuid>"}`: the
query's id, kept across restarts, new with a new checkpoint), `<checkpoint>/offsets/<batch id>`
before it runs a batch and `<checkpoint>/commits/<batch id>` once the batch's foreachBatch
returned. An offset log entry is a version line (`v1`), a metadata line, then one line per
source holding that source's end offset, here the Kafka offset JSON (`{"topic": {"0": 42}}`, the
next offset to read). Unlike the offsets of the records a batch read, it names every subscribed
partition, idle ones included, and survives restarts.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from cdc_sync.source.offsets import PartitionOffsets, from_offset_json

log = logging.getLogger(__name__)

OFFSET_LOG = "offsets"
COMMIT_LOG = "commits"
QUERY_METADATA = "metadata"


def batch_ids(folder: Path) -> list[int]:
    """The batch ids of a log folder (`offsets`, `commits`), ascending; none if it is absent."""
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def last_committed_batch(checkpoint_dir: Path) -> int | None:
    """The newest batch Spark committed under `checkpoint_dir`; None before the first."""
    committed = batch_ids(checkpoint_dir / COMMIT_LOG)
    return committed[-1] if committed else None


def query_id(checkpoint_dir: Path) -> str | None:
    """The id of the query that owns `checkpoint_dir`; None before the query first started."""
    path = checkpoint_dir / QUERY_METADATA
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: not a Spark checkpoint's metadata ({error})") from error
    found = document.get("id") if isinstance(document, dict) else None
    if not isinstance(found, str):
        raise ValueError(f"{path}: not a Spark checkpoint's metadata (no query id)")
    return found


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
