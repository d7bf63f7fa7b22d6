"""What the streaming query's checkpoint says it processed (read-only; Spark owns the files),
and whether the broker's topics still match it (`stale_checkpoints`, at the job's start).

Spark writes `offsets/<batch>` when a batch is planned (a version line, a metadata line, then one
JSON line per source: the offsets the batch reads up to) and `commits/<batch>` once its
`foreachBatch` returned, i.e. every sink acknowledged it. The newest batch with both is what the
job processed; offsets are the next offset to read per partition, in the source's JSON shape
(`source.offsets`, the same for Spark's built-in Kafka source and ours).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cdc_sync.core.errors import ConfigError
from cdc_sync.core.settings import Connections, state_dir
from cdc_sync.job.consumers import Consumer
from cdc_sync.source.checkpoint import COMMIT_LOG, OFFSET_LOG, batch_ids
from cdc_sync.source.data_loss import StaleCheckpoint, stale_checkpoint
from cdc_sync.source.end_offsets import EndOffsets, KafkaException
from cdc_sync.source.offsets import PartitionOffsets, loads
from cdc_sync.source.options import FAIL_ON_DATA_LOSS

log = logging.getLogger(__name__)


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


def stale_line(stale: StaleCheckpoint, checkpoint_dir: Path) -> str:
    """What is stale about a consumer's checkpoint, and the commands that start over."""
    return (
        f"checkpoint {checkpoint_dir}: {stale.describe()}. Start over: `rm -r {checkpoint_dir}` "
        "(this consumer replays the topics), or `cdc-sync run --checkpoint NEW_DIR` (every "
        "consumer); the sinks are fenced by version, so a replay is harmless"
    )


class StaleCheckpoints(ConfigError):
    """Consumers whose checkpoints the broker's topics no longer match: one line each, every
    line naming its consumer and checkpoint (the CLI prints them as they are, exit 2)."""

    def __init__(self, root: Path, lines: Sequence[str]) -> None:
        super().__init__(str(root), "checkpoint", "\n".join(lines))
        self.lines = list(lines)

    def __str__(self) -> str:
        return self.message


def stale_checkpoints(consumers: Sequence[Consumer], connections: Connections) -> list[str]:
    """`consumer NAME: ...` for each consumer whose checkpoint the broker's topics no longer
    match (`source.data_loss.stale_checkpoint`); fresh checkpoints are not checked."""
    lines = []
    ends = EndOffsets(connections.require("kafka_bootstrap"), connections.kafka_flavor)
    try:
        for consumer in consumers:
            processed = processed_offsets(consumer.checkpoint_dir)
            if processed is None:
                continue
            topics = consumer.mapping.topics()
            stale = stale_checkpoint(processed.offsets, ends.of(topics), topics)
            if stale is not None:
                lines.append(
                    f"consumer {consumer.name}: {stale_line(stale, consumer.checkpoint_dir)}"
                )
    except KafkaException as error:  # the stream says so itself once it asks the broker
        log.warning("checkpoints not checked against the broker: %s", error)
    finally:
        ends.close()
    return lines


def refuse_stale_checkpoints(
    consumers: Sequence[Consumer], connections: Connections, root: Path, fail_on_data_loss: bool
) -> None:
    """At the job's start: stale checkpoints refuse it (StaleCheckpoints, one line per
    consumer), or under failOnDataLoss=false are logged, the job going on (rebased, or idle
    on missing topics until they come back)."""
    lines = stale_checkpoints(consumers, connections)
    if lines and fail_on_data_loss:
        raise StaleCheckpoints(root, lines)
    for line in lines:
        log.warning("%s=false: %s", FAIL_ON_DATA_LOSS, line)
