"""The sync job's options (`cdc-sync run` flags), shared by the application and its consumers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cdc_sync.core.retry import (
    DEFAULT_ATTEMPT_TIMEOUT_SECONDS,
    DEFAULT_HORIZON_SECONDS,
    RetryObserver,
    RetryPolicy,
)
from cdc_sync.core.settings import Connections, state_dir
from cdc_sync.documents import BULKS_IN_FLIGHT
from cdc_sync.job.observe.checkpoint import default_checkpoint_dir
from cdc_sync.job.observe.metrics_export import DEFAULT_METRICS_HOST, DEFAULT_PROBE_SECONDS
from cdc_sync.mapping import MappingFile

# Records per micro-batch at most: after an outage one batch would otherwise hold the whole
# backlog in memory (83,772 records were seen in one). ~20k keeps a batch within seconds.
DEFAULT_MAX_OFFSETS_PER_TRIGGER = 20_000
DEFAULT_TRIGGER_SECONDS = 0.25
# Up to here a batch is written faster by the driver alone than by two Spark jobs on this
# build machine (`make bench`); streaming at hundreds of changes a second stays below it.
DEFAULT_DRIVER_BATCH_MAX_RECORDS = 2_000


@dataclass(frozen=True)
class JobOptions:
    # The root of the consumers' checkpoints (job.consumers: one folder per consumer).
    checkpoint_dir: Path
    warehouse: Path
    # A micro-batch starts this often at most (back to back when one takes longer); a change
    # waits half of it on average before its batch starts. An idle trigger asks the broker for
    # its end offsets, a few milliseconds.
    trigger_seconds: float = DEFAULT_TRIGGER_SECONDS
    max_offsets_per_trigger: int | None = DEFAULT_MAX_OFFSETS_PER_TRIGGER  # None: unbounded
    # Checkpoint offsets the broker no longer has (topic re-created, retention): fail (default)
    # or warn and continue from the partition's low watermark. The source's failOnDataLoss.
    fail_on_data_loss: bool = True
    # The queries' names start with this (default cdc-sync-<mapping>), then the consumer's.
    query_name: str | None = None
    # A sink that fails transiently (down, frozen, 5xx/429) is retried this long from the
    # write's first failure before the batch fails, which ends the streaming query.
    sink_retry_horizon_seconds: float = DEFAULT_HORIZON_SECONDS
    # Each request to a sink gives up after this long (a hung server fails the attempt).
    sink_request_timeout_seconds: float = DEFAULT_ATTEMPT_TIMEOUT_SECONDS
    # Prometheus metrics on http://<metrics_host>:<metrics_port>/metrics; None: off, 0: any port.
    metrics_port: int | None = None
    metrics_host: str = DEFAULT_METRICS_HOST
    # How often the broker's end offsets, the slot and the connector are read for the metrics.
    metrics_probe_seconds: float = DEFAULT_PROBE_SECONDS
    # The initial snapshot's live progress view; None: when stdout is a terminal.
    snapshot_progress: bool | None = None
    # Delta upkeep (compact, vacuum, prune tombstones) after every N-th batch; None: off.
    maintain_every_batches: int | None = None
    # Batches of at most this many records run on the driver, without Spark jobs (a Spark
    # job's fixed cost dominates a small batch: job.batch_phases); 0: always on the executors.
    driver_batch_max_records: int = DEFAULT_DRIVER_BATCH_MAX_RECORDS
    # The consumers this application runs (job.consumers); None: every one the mapping needs.
    consumers: frozenset[str] | None = None
    # A document consumer's bulk requests sent and not yet answered, at most (documents.sync).
    document_bulks_in_flight: int = BULKS_IN_FLIGHT

    def sink_retry(self, observer: RetryObserver | None = None) -> RetryPolicy:
        """The retry policy every sink writes under, reporting to `observer`."""
        return RetryPolicy(
            horizon_seconds=self.sink_retry_horizon_seconds,
            attempt_timeout_seconds=self.sink_request_timeout_seconds,
            observer=observer,
        )

    def query_prefix(self, mapping: MappingFile) -> str:
        return self.query_name or f"cdc-sync-{mapping.path.stem}"

    @classmethod
    def defaults(cls, mapping: MappingFile, connections: Connections) -> JobOptions:
        root = state_dir()
        return cls(
            checkpoint_dir=default_checkpoint_dir(mapping.path),
            warehouse=Path(connections.warehouse) if connections.warehouse else root / "warehouse",
        )
