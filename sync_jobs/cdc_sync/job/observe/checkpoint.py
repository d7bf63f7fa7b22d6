"""What the streaming query's checkpoint says it processed (read-only; Spark owns the files).

Spark writes `offsets/<batch>` when a batch is planned (a version line, a metadata line, then one
JSON line per source: the offsets the batch reads up to) and `commits/<batch>` once its
`foreachBatch` returned, i.e. every sink acknowledged it. The newest batch with both is what the
job processed; offsets are the next offset to read per partition, in the source's JSON shape
(`source.offsets`, the same for Spark's built-in Kafka source and ours).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cdc_sync.core.settings import state_dir
from cdc_sync.source.checkpoint import COMMIT_LOG, OFFSET_LOG, batch_ids
from cdc_sync.source.offsets import PartitionOffsets, loads


def default_checkpoint_dir(mapping_path: Path) -> Path:
    """Where a mapping's job keeps its checkpoint unless told otherwise."""
    return state_dir() / "checkpoints" / mapping_path.stem


@dataclass(frozen=True)
class Processed:
    batch_id: int
    offsets: PartitionOffsets  # next offset to read per (topic, partition)


def processed_offsets(checkpoint_dir: Path) -> Processed | None:
    """The newest committed batch and its end offsets; None before the first commit."""
    planned = set(batch_ids(checkpoint_dir / OFFSET_LOG))
    committed = [b for b in batch_ids(checkpoint_dir / COMMIT_LOG) if b in planned]
    if not committed:
        return None
    batch = committed[-1]
    path = checkpoint_dir / OFFSET_LOG / str(batch)
    lines = path.read_text(encoding="utf-8").splitlines()
    if len(lines) < 3 or not lines[0].startswith("v"):
        raise ValueError(
            f"{path}: not a Spark offset log entry (expected version, metadata, "
            "then one offset line per source)"
        )
    offsets: PartitionOffsets = {}
    for line in lines[2:]:
        if line.strip() and line.strip() != "-":  # "-": a source without offsets yet
            offsets.update(loads(line))
    return Processed(batch, offsets)
