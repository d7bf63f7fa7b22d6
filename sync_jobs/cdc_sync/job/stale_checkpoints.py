"""At the job's start: does each consumer's checkpoint still match the broker's topics?

A checkpoint that read topics the broker does not have (deleted, a broker reset: the query
would sit idle on them without a word) or whose offsets lie past a partition's end (re-created:
its first batch would fail with a Spark trace) stops the job before any query starts, one line
per consumer with the commands that start over; `cdc-sync status` says the same. The rule is
`source.data_loss.stale_checkpoint`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from cdc_sync.core.errors import ConfigError
from cdc_sync.core.settings import Connections
from cdc_sync.job.consumers import Consumer
from cdc_sync.job.observe.checkpoint import processed_offsets
from cdc_sync.source.data_loss import StaleCheckpoint, stale_checkpoint
from cdc_sync.source.end_offsets import EndOffsets, KafkaException
from cdc_sync.source.options import FAIL_ON_DATA_LOSS

log = logging.getLogger(__name__)


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
    consumer), or under failOnDataLoss=false are logged, the job going on (rebased; missing
    topics forgotten, read from their start once they exist again)."""
    lines = stale_checkpoints(consumers, connections)
    if lines and fail_on_data_loss:
        raise StaleCheckpoints(root, lines)
    for line in lines:
        log.warning("%s=false: %s", FAIL_ON_DATA_LOSS, line)
