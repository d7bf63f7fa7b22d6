"""What every sink shares: results, error classes, the Sink protocol."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from cdc_sync.core.model import Change, Truncate
from cdc_sync.core.retry import TransientSinkError
from cdc_sync.mapping import TableRoute
from cdc_sync.schema import RowSchema

__all__ = ["RecordFailure", "Sink", "TransientSinkError", "WriteResult"]


@dataclass(frozen=True)
class RecordFailure:
    """A record the target refused for good (mapping conflict, wrong type): dead-lettered."""

    change: Change
    error_class: str  # e.g. "mapper_parsing_exception", "ResponseError"
    message: str  # never contains row payloads


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


class Sink(Protocol):
    name: str

    def ensure_target(self, route: TableRoute, schema: RowSchema | None) -> None:
        """Create the index/table or evolve it to `schema` (idempotent, no data writes)."""

    def apply(self, route: TableRoute, changes: Sequence[Change]) -> WriteResult:
        """Write compacted, routed changes; per-record terminal failures come back in the result.
        A soft delete's mark (`Change.marks_deleted`) goes over the row held, else deletes."""

    def truncate(self, route: TableRoute, truncate: Truncate) -> int:
        """Remove the table's rows older than `truncate` (`sinks.truncates`): fenced, a row
        written by a later change stays; a snapshot's end in a soft-delete sink marks them
        instead. Returns the rows removed (or marked)."""

    def record_watermark(self, routes: Mapping[str, TableRoute], position: int) -> None:
        """Store `position` (a WAL position) as the applied watermark of each topic in `routes`
        (`<topic.prefix>.<schema>.<table>` -> its route) that this sink serves, never lowering a
        stored one. Its `readback.watermarks` reads them back."""

    def close(self) -> None: ...
