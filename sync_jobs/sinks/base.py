"""What every sink shares: capabilities, results, error classes, the Sink protocol."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from sync_jobs.events import Change
from sync_jobs.mapping import TableRoute
from sync_jobs.schema import RowSchema


@dataclass(frozen=True)
class SinkCapabilities:
    """Declared per sink (dlt-style), checked by tests and shown by `cdc-sync run --explain`."""

    fenced_upserts: bool  # an older version never overwrites a newer one
    fenced_deletes: bool  # a stale update after a delete does not resurrect the row
    merges_unavailable_columns: bool  # unchanged TOAST values keep the stored value
    evolves_schema: bool  # new columns appear without a restart


class ErrorKind(StrEnum):
    TRANSIENT = "transient"  # retried with backoff; the batch fails if retries run out
    TERMINAL = "terminal"  # the record is dead-lettered; the batch goes on


@dataclass(frozen=True)
class RecordFailure:
    change: Change
    error_class: str  # e.g. "mapper_parsing_exception", "ResponseError"
    message: str  # never contains row payloads
    kind: ErrorKind = ErrorKind.TERMINAL


@dataclass
class WriteResult:
    applied: int = 0
    fenced: int = 0  # rejected by the target as older than what it holds: not an error
    failures: list[RecordFailure] = field(default_factory=list)

    def merge(self, other: WriteResult) -> WriteResult:
        return WriteResult(
            self.applied + other.applied,
            self.fenced + other.fenced,
            self.failures + other.failures,
        )


class TransientSinkError(RuntimeError):
    """The whole write failed for a reason that may pass (connection, timeout, overload)."""


class Sink(Protocol):
    name: str
    capabilities: SinkCapabilities

    def ensure_target(self, route: TableRoute, schema: RowSchema | None) -> None:
        """Create the index/table or evolve it to `schema` (idempotent, no data writes)."""

    def apply(self, route: TableRoute, changes: Sequence[Change]) -> WriteResult:
        """Write compacted, routed changes; per-record terminal failures come back in the result."""

    def close(self) -> None: ...
