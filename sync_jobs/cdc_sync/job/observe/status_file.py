"""The job's own account of itself, for `cdc-sync status`: `<checkpoint>/cdc_sync_status.json`.

Written by `StatusRecorder`, a batch observer (so only what every sink acknowledged), and by a
heartbeat thread every few seconds (so a reader can tell a live idle job from a dead one, and
sees a sink the current batch is waiting for). Replaced atomically on every write. It lives with
the checkpoint because it describes the same streaming query: per table the newest version and
source commit time applied, the last batch's counts and stage timings, the sinks' health.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from cdc_sync.core.files import write_atomically
from cdc_sync.core.model import TableId
from cdc_sync.job.settle.applier import BatchMetrics
from cdc_sync.job.write.health import SinkHealth, SinkStatus

log = logging.getLogger(__name__)

STATUS_FILE = "cdc_sync_status.json"
FORMAT = 1
HEARTBEAT_SECONDS = 5.0


def status_path(checkpoint_dir: Path) -> Path:
    return checkpoint_dir / STATUS_FILE


@dataclass(frozen=True)
class TableMark:
    """The newest change of a table that every sink routing it acknowledged."""

    version: int | None
    source_ts_ms: int | None  # source commit time of the newest change applied
    applied_at: float  # wall-clock seconds when the batch holding it finished


@dataclass(frozen=True)
class LastBatch:
    batch_id: int
    finished_at: float  # wall-clock seconds
    records: int
    changes: int
    compacted: int
    dead_lettered: int
    seconds: float  # the whole batch: Spark stages and the driver's apply
    stages: dict[str, float]
    sinks: dict[str, dict[str, int]]  # sink -> applied / fenced / failed
    offsets: dict[str, dict[str, int]]  # topic -> partition -> highest offset read


@dataclass(frozen=True)
class JobStatus:
    mapping: str
    pid: int
    host: str
    started_at: float
    alive_at: float  # the latest heartbeat or batch
    state: str = "running"  # running | stopped | failed
    error: str | None = None  # why the query ended, when it failed
    last_batch: LastBatch | None = None
    tables: dict[str, TableMark] = field(default_factory=dict)
    sink_tables: dict[str, list[str]] = field(default_factory=dict)  # sink -> tables it routes
    sink_health: dict[str, dict[str, Any]] = field(default_factory=dict)
    batches: int = 0  # since this process started the job
    dead_lettered: int = 0  # since this process started the job
    consumer: str = "job"  # the consumer of the log it describes (job.consumers)

    def to_json(self) -> str:
        # Not key-sorted: stages keep their pipeline order (decode, fold, fill, sinks).
        return json.dumps({"format": FORMAT, **asdict(self)}, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> JobStatus:
        document = json.loads(text)
        if not isinstance(document, dict) or document.pop("format", None) != FORMAT:
            raise ValueError(f"expected a JSON object with format {FORMAT}")
        batch = document.pop("last_batch", None)
        tables = document.pop("tables", {})
        return cls(
            **document,
            last_batch=LastBatch(**batch) if batch else None,
            tables={name: TableMark(**mark) for name, mark in tables.items()},
        )


def read_status(checkpoint_dir: Path) -> JobStatus | None:
    """The status file beside `checkpoint_dir`; None when the job never wrote one there."""
    path = status_path(checkpoint_dir)
    try:
        return JobStatus.from_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as error:
        raise ValueError(f"{path}: unreadable job status ({error})") from error


def batch_seconds(metrics: BatchMetrics) -> float:
    """Wall time of the whole batch: the Spark stages (decode, fold) plus the driver's apply."""
    return metrics.seconds + metrics.stages.get("decode", 0.0) + metrics.stages.get("fold", 0.0)


def _health(status: SinkStatus) -> dict[str, Any]:
    return {
        "state": status.state.value,
        "since": status.since,
        "what": status.what,
        "error_class": status.error_class,
        "failures": status.failures,
    }


class StatusRecorder:
    """Keeps `<checkpoint>/cdc_sync_status.json` current; a `BatchObserver` (call it per batch)."""

    def __init__(
        self,
        checkpoint_dir: Path,
        mapping_name: str,
        sink_tables: Mapping[str, list[TableId]],
        health: SinkHealth | None = None,
        heartbeat_seconds: float = HEARTBEAT_SECONDS,
        consumer: str = "job",
    ) -> None:
        """`sink_tables`: the tables each of this consumer's sinks routes; `health`: sink
        health, of which the consumer's own sinks are recorded."""
        self.path = status_path(checkpoint_dir)
        self.own_sinks = frozenset(sink_tables)
        self.health = health
        self.heartbeat_seconds = heartbeat_seconds
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._query_state: Callable[[], tuple[str, str | None]] | None = None
        now = time.time()
        previous = self._previous()
        # Watermarks outlive restarts on the same checkpoint: an idle table keeps its mark.
        self.status = JobStatus(
            mapping=mapping_name,
            pid=os.getpid(),
            host=socket.gethostname(),
            started_at=now,
            alive_at=now,
            tables=dict(previous.tables) if previous else {},
            last_batch=previous.last_batch if previous else None,
            sink_tables={sink: sorted(map(str, t)) for sink, t in sink_tables.items()},
            consumer=consumer,
        )
        self._write()

    def _previous(self) -> JobStatus | None:
        try:
            return read_status(self.path.parent)
        except ValueError as error:
            log.warning("%s; starting a new one", error)
            return None

    def __call__(self, metrics: BatchMetrics) -> None:
        now = time.time()
        with self._lock:
            tables = dict(self.status.tables)
            for table, progress in metrics.tables.items():
                mark = tables.get(str(table))
                tables[str(table)] = TableMark(
                    _newest(mark.version if mark else None, progress.max_version),
                    _newest(mark.source_ts_ms if mark else None, progress.max_source_ts_ms),
                    now,
                )
            self.status = replace(
                self.status,
                alive_at=now,
                tables=tables,
                last_batch=_last_batch(metrics, now),
                batches=self.status.batches + 1,
                dead_lettered=self.status.dead_lettered + metrics.dead_lettered,
            )
            self._write()

    def start_heartbeat(self, query_state: Callable[[], tuple[str, str | None]]) -> None:
        """Every `heartbeat_seconds`, record liveness, sink health and `query_state()`:
        (running | stopped | failed, error)."""
        self._query_state = query_state
        if self._thread is not None and self._thread.is_alive():
            return  # a restarted query: the running heartbeat asks the new `query_state`
        self.beat()
        self._thread = threading.Thread(target=self._beat, name="cdc-sync-status", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_seconds):
            if self._query_state is None:
                continue
            try:
                state, error = self._query_state()
            except Exception as exc:  # the session is going away; close() writes the end
                log.debug("status heartbeat: query state unavailable (%s)", exc)
                continue
            self.beat(state, error)
            if state != "running":
                return

    def beat(self, state: str = "running", error: str | None = None) -> None:
        with self._lock:
            self.status = replace(self.status, alive_at=time.time(), state=state, error=error)
            self._write()

    def close(self) -> None:
        """The job is stopping: end the heartbeat and record how the query ended."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.heartbeat_seconds + 5)
        if self.status.state != "running":
            return  # the heartbeat already recorded the end
        state, error = "stopped", None
        if self._query_state is not None:
            try:
                state, error = self._query_state()
            except Exception as exc:  # the session may be gone already
                log.debug("status: query state unavailable at close (%s)", exc)
        self.beat("stopped" if state == "running" else state, error)

    def _write(self) -> None:
        if self.health is not None:
            self.status = replace(
                self.status,
                sink_health={
                    n: _health(s)
                    for n, s in sorted(self.health.status().items())
                    if n in self.own_sinks
                },
            )
        try:
            # Not durable: the next batch or heartbeat renews it, and two fsyncs a batch of
            # every consumer were 7% of a small batch's time (py-spy, 2026-11-28).
            write_atomically(self.path, self.status.to_json(), durable=False)
        except OSError as error:  # status is for operators; never fail a batch over it
            log.warning("could not write the job status %s: %s", self.path, error)


def _newest(old: int | None, new: int | None) -> int | None:
    if old is None:
        return new
    return old if new is None else max(old, new)


def _last_batch(metrics: BatchMetrics, now: float) -> LastBatch:
    offsets: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(metrics.offsets.items()):
        offsets.setdefault(topic, {})[str(partition)] = offset
    return LastBatch(
        batch_id=metrics.batch_id,
        finished_at=now,
        records=metrics.records,
        changes=metrics.changes,
        compacted=metrics.compacted,
        dead_lettered=metrics.dead_lettered,
        seconds=round(batch_seconds(metrics), 3),
        stages={name: round(took, 3) for name, took in metrics.stages.items()},
        sinks={
            name: {"applied": r.applied, "fenced": r.fenced, "failed": len(r.failures)}
            for name, r in metrics.sinks.items()
        },
        offsets=offsets,
    )
