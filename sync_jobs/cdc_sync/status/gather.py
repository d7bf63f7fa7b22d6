"""Collect a `Snapshot`: each part read on its own, so one unreachable service is a reported
problem, not a crash, and the rest of the screen still shows."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Protocol, TypeVar

from cdc_sync.connectors.engine import default_state_dir, offsets_path
from cdc_sync.connectors.ops import load_target
from cdc_sync.core.kafka_clients import consumer_config
from cdc_sync.core.settings import Connections
from cdc_sync.debezium.database import SourceMismatch
from cdc_sync.job.consumers import plan_consumers, refuse_single_query_checkpoint
from cdc_sync.job.observe.checkpoint import processed_offsets
from cdc_sync.job.observe.status_file import JobStatus, read_status
from cdc_sync.job.stale_checkpoints import stale_line
from cdc_sync.mapping import MappingFile
from cdc_sync.source.data_loss import stale_checkpoint
from cdc_sync.status.broker import partition_status, record_count
from cdc_sync.status.capture import connect_status, slot_status
from cdc_sync.status.model import (
    CaptureStatus,
    ConsumerSnapshot,
    SlotStatus,
    Snapshot,
    Watermark,
)
from cdc_sync.status.process import job_alive

T = TypeVar("T")


class WatermarkSource(Protocol):
    """Where per-sink watermarks come from. Today the job's status file; a durable per-sink
    store (a Redis hash, a Delta table property) can stand in by implementing this."""

    def watermarks(self) -> list[Watermark]: ...


class StatusFileWatermarks:
    """Watermarks from a consumer's status file: a table's mark holds for the consumer's sink,
    because the consumer records a batch only once its sink acknowledged it."""

    def __init__(self, job: JobStatus | None) -> None:
        self.job = job

    def watermarks(self) -> list[Watermark]:
        if self.job is None:
            return []
        marks = []
        for sink, tables in sorted(self.job.sink_tables.items()):
            for table in tables:
                mark = self.job.tables.get(table)
                marks.append(
                    Watermark(
                        sink,
                        table,
                        mark.version if mark else None,
                        mark.source_ts_ms if mark else None,
                        mark.applied_at if mark else None,
                    )
                )
        return marks


class Attempts:
    """Runs each read; a failure becomes a problem line naming what could not be read. A
    setting that points at another database than the connector's is no such failure: it is
    refused (SourceMismatch), as every command refuses it."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def __call__(self, what: str, read: Callable[[], T]) -> T | None:
        try:
            return read()
        except SourceMismatch:
            raise
        except Exception as error:  # any failure to read one part is reported, not raised
            self.problems.append(f"{what}: {type(error).__name__}: {_first_line(error)}")
            return None


def gather(
    mapping: MappingFile,
    connections: Connections,
    checkpoint_dir: Path,
    connector_file: Path | None,
    watermark_source: Callable[[JobStatus | None], WatermarkSource] = StatusFileWatermarks,
) -> Snapshot:
    """`checkpoint_dir`: the root of the job's checkpoints, one per consumer of the log."""
    attempt = Attempts()
    # First: a database mismatch refuses the command before anything else is read.
    capture, slot = _capture(connections, connector_file or mapping.connector, attempt)
    attempt("the checkpoint", lambda: refuse_single_query_checkpoint(checkpoint_dir))
    # librdkafka would print every failed connection attempt; the problem line says it once.
    kafka = consumer_config(
        connections.require("kafka_bootstrap"),
        connections.kafka_flavor,
        "cdc-sync-status",
        log_level=0,
    )
    consumers = []
    broker_answers = True
    for consumer in plan_consumers(mapping, checkpoint_dir, check_layout=False):
        where = consumer.checkpoint_dir
        label = f"consumer {consumer.name}"
        job = attempt(f"{label}: its status file", partial(read_status, where))
        processed = attempt(f"{label}: its checkpoint", partial(processed_offsets, where))
        partitions = None
        if broker_answers:  # one timeout is enough
            offsets = processed.offsets if processed else {}
            partitions = attempt(
                "the broker", partial(partition_status, kafka, consumer.mapping.topics(), offsets)
            )
            broker_answers = partitions is not None
        stale = None
        if processed is not None and partitions is not None:
            ends = {(p.topic, p.partition): p.end_offset for p in partitions}
            found = stale_checkpoint(processed.offsets, ends, consumer.mapping.topics())
            stale = None if found is None else stale_line(found, where)
        consumers.append(
            ConsumerSnapshot(
                consumer.name,
                str(where),
                job,
                tuple(partitions or ()),
                tuple(watermark_source(job).watermarks()),
                job_alive(job) if job is not None and job.state == "running" else None,
                stale,
            )
        )
    dead_letters = (
        attempt("the dead-letter topic", lambda: record_count(kafka, mapping.dead_letter_topic))
        if broker_answers
        else None
    )
    return Snapshot(
        taken_at=time.time(),
        mapping=mapping.path.stem,
        checkpoint=str(checkpoint_dir),
        capture=capture,
        slot=slot,
        consumers=tuple(consumers),
        dead_letter_topic=mapping.dead_letter_topic,
        dead_letters=dead_letters,
        problems=tuple(attempt.problems),
    )


def _capture(
    connections: Connections,
    connector_file: Path | None,
    attempt: Attempts,
) -> tuple[CaptureStatus | None, SlotStatus | None]:
    if connector_file is None:
        return None, None
    target = attempt(
        "the connector file and its database",
        lambda: load_target(str(connector_file), [], connections),
    )
    if target is None:
        return None, None
    name = target.config["name"]
    if connections.connect_url:
        url = connections.connect_url
        capture = attempt("Kafka Connect", lambda: connect_status(url, name)) or CaptureStatus(
            "kafka-connect", name, "UNKNOWN"
        )
    else:
        offsets = offsets_path(default_state_dir(connector_file), name)
        capture = CaptureStatus(
            "embedded",
            name,
            None,
            offsets_file=str(offsets) if offsets.exists() else None,
            connector_file=str(connector_file),
        )
    slot = attempt("the replication slot", lambda: slot_status(target.conninfo, target.resolved))
    return capture, slot


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else ""
