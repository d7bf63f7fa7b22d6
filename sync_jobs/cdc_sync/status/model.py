"""What `cdc-sync status` gathered: plain frozen data, no I/O (verdict and rendering work on it)."""

from __future__ import annotations

from dataclasses import dataclass

from cdc_sync.job.observe.status_file import JobStatus


@dataclass(frozen=True)
class TaskState:
    id: int
    state: str
    trace: str | None = None  # first line of the worker's trace when the task failed


@dataclass(frozen=True)
class CaptureStatus:
    kind: str  # "kafka-connect" (REST) | "embedded" (only the slot tells whether it runs)
    connector: str
    state: str | None  # Connect's connector state, "NOT REGISTERED"; None when embedded
    tasks: tuple[TaskState, ...] = ()
    # Embedded: the offsets file `cdc-sync capture` keeps by default, when it exists.
    offsets_file: str | None = None
    connector_file: str | None = None


@dataclass(frozen=True)
class SlotStatus:
    name: str
    exists: bool
    active: bool = False
    wal_status: str | None = None  # reserved | extended | unreserved | lost
    retained_bytes: int | None = None  # WAL the slot keeps from being recycled
    lag_bytes: int | None = None  # WAL written since the consumer's confirmed position
    keep_bytes: int | None = None  # max_slot_wal_keep_size; None = unlimited


@dataclass(frozen=True)
class PartitionStatus:
    topic: str
    partition: int
    end_offset: int
    low_offset: int
    processed_offset: int | None  # the job's next offset to read; None before its first commit
    oldest_waiting_ms: int | None = None  # Kafka timestamp of the first record not processed

    @property
    def waiting(self) -> int:
        start = self.low_offset if self.processed_offset is None else self.processed_offset
        return max(0, self.end_offset - max(start, self.low_offset))


@dataclass(frozen=True)
class Watermark:
    """The newest change of `table` that `sink` holds (every sink acknowledged it)."""

    sink: str
    table: str
    version: int | None
    source_ts_ms: int | None  # source commit time of that change
    applied_at: float | None  # wall-clock seconds


@dataclass(frozen=True)
class ConsumerSnapshot:
    """One consumer of the log (job.consumers: a sink, or a document index): what its status
    file and checkpoint say, and the broker's partitions against its processed offsets."""

    name: str
    checkpoint: str
    job: JobStatus | None  # None: no status file beside its checkpoint
    partitions: tuple[PartitionStatus, ...] = ()
    watermarks: tuple[Watermark, ...] = ()
    # Whether the job's process still runs (status.process); None: not known from this host.
    job_alive: bool | None = None
    # What the broker's topics no longer match in its checkpoint (job.stale_checkpoints.stale_line).
    stale_checkpoint: str | None = None

    @property
    def waiting(self) -> int:
        return sum(p.waiting for p in self.partitions)


@dataclass(frozen=True)
class Snapshot:
    taken_at: float  # wall-clock seconds
    mapping: str
    checkpoint: str  # the root of the consumers' checkpoints
    capture: CaptureStatus | None
    slot: SlotStatus | None
    consumers: tuple[ConsumerSnapshot, ...]
    dead_letter_topic: str
    dead_letters: int | None  # records on the dead-letter topic; None when unreadable
    problems: tuple[str, ...] = ()  # what could not be read, and why

    @property
    def waiting(self) -> int:
        """Records the slowest consumer has still to apply."""
        return max((c.waiting for c in self.consumers), default=0)
