"""Collect a `Snapshot`: each part read on its own, so one unreachable service is a reported
problem, not a crash, and the rest of the screen still shows."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

from cdc_sync.connectors.ops import load_target
from cdc_sync.core.kafka_clients import consumer_config
from cdc_sync.core.settings import Connections
from cdc_sync.debezium.database import SourceMismatch
from cdc_sync.job.checkpoint import processed_offsets
from cdc_sync.job.status_file import JobStatus, read_status
from cdc_sync.mapping import MappingFile
from cdc_sync.status.broker import partition_status, record_count
from cdc_sync.status.capture import connect_status, slot_status
from cdc_sync.status.model import CaptureStatus, SlotStatus, Snapshot, Watermark
from cdc_sync.status.process import job_alive

T = TypeVar("T")


class WatermarkSource(Protocol):
    """Where per-sink watermarks come from. Today the job's status file; a durable per-sink
    store (a Redis hash, a Delta table property) can stand in by implementing this."""

    def watermarks(self) -> list[Watermark]: ...


class StatusFileWatermarks:
    """Watermarks from the job's status file: a table's mark holds for every sink routing it,
    because the job records a batch only once every sink acknowledged it."""

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
    attempt = Attempts()
    # First: a database mismatch refuses the command before anything else is read.
    capture, slot = _capture(connections, connector_file or mapping.connector, attempt)
    job = attempt("the job status file", lambda: read_status(checkpoint_dir))
    processed = attempt("the checkpoint", lambda: processed_offsets(checkpoint_dir))
    # librdkafka would print every failed connection attempt; the problem line says it once.
    kafka = consumer_config(
        connections.require("kafka_bootstrap"),
        connections.kafka_flavor,
        "cdc-sync-status",
        log_level=0,
    )
    partitions = attempt(
        "the broker",
        lambda: partition_status(kafka, mapping.topics(), processed.offsets if processed else {}),
    )
    dead_letters = (
        attempt("the dead-letter topic", lambda: record_count(kafka, mapping.dead_letter_topic))
        if partitions is not None  # the broker answered: one timeout is enough
        else None
    )
    return Snapshot(
        taken_at=time.time(),
        mapping=mapping.path.stem,
        checkpoint=str(checkpoint_dir),
        capture=capture,
        slot=slot,
        partitions=tuple(partitions or ()),
        watermarks=tuple(watermark_source(job).watermarks()),
        dead_letter_topic=mapping.dead_letter_topic,
        dead_letters=dead_letters,
        job=job,
        problems=tuple(attempt.problems),
        job_alive=job_alive(job) if job is not None and job.state == "running" else None,
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
        capture = CaptureStatus("embedded", name, None)
    slot = attempt("the replication slot", lambda: slot_status(target.conninfo, target.resolved))
    return capture, slot


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else ""
