"""Warehouse sink: one Delta table per routed table, fenced MERGE by `_cdc_version`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from deltalake.exceptions import CommitFailedError

from cdc_sync.core.model import Change, Truncate
from cdc_sync.core.retry import DEFAULT_POLICY, RetryPolicy, retried
from cdc_sync.mapping import DeltaRoute, TableRoute
from cdc_sync.schema import RowSchema
from cdc_sync.schema.arrow import arrow_schema
from cdc_sync.sinks.base import WriteResult
from cdc_sync.sinks.delta.actions import DeltaActions, snapshot_end_marks, to_actions
from cdc_sync.sinks.delta.client import DeltaLakeWriter
from cdc_sync.sinks.delta.history_writer import HistoryWriter
from cdc_sync.sinks.delta.target import ensure_history, ensure_table
from cdc_sync.sinks.delta.watermarks import DeltaWatermarks
from cdc_sync.sinks.truncates import marks_at_snapshot_end


class DeltaWriter(Protocol):
    def write_batch(self, route: DeltaRoute, actions: DeltaActions) -> WriteResult: ...

    def truncate(self, route: DeltaRoute, version: int) -> int:
        """DELETE the rows older than `version` (`actions.truncate_predicate`); rows removed."""

    def mark_older(
        self, route: DeltaRoute, version: int, marker: str, values: Mapping[str, Any]
    ) -> int:
        """UPDATE the rows older than `version` whose boolean `marker` is not true with
        `values` (`actions.marks_predicate`, `snapshot_end_marks`); rows marked."""


def is_transient(exc: BaseException) -> bool:
    # A concurrent commit or a flaky filesystem may pass; anything else is a bug or bad data.
    return isinstance(exc, CommitFailedError | OSError)


class DeltaSink:
    name = "delta"

    def __init__(
        self,
        warehouse: Path,
        tombstone_retention_seconds: int,
        writer: DeltaWriter | None = None,
        retry: RetryPolicy = DEFAULT_POLICY,
    ) -> None:
        self.warehouse = warehouse
        self.retry = retry.for_target(self.name)
        self.writer = writer or DeltaLakeWriter(warehouse, tombstone_retention_seconds)
        self.watermarks = DeltaWatermarks(warehouse)
        self.history = HistoryWriter(warehouse)  # through deltalake whatever the writer

    def ensure_target(self, route: TableRoute, schema: RowSchema | None) -> None:
        if route.delta is None or schema is None:
            return
        delta = route.delta
        retried(
            lambda: ensure_table(self.warehouse, delta, arrow_schema(schema)),
            is_transient,
            f"delta ensure_target {delta.relative_path()}",
            self.retry,
        )
        if delta.history:
            retried(
                lambda: ensure_history(self.warehouse, delta, arrow_schema(schema)),
                is_transient,
                f"delta ensure_target {delta.history_relative_path()}",
                self.retry,
            )

    def apply(self, route: TableRoute, changes: Sequence[Change]) -> WriteResult:
        delta = route.delta
        actions = to_actions(route, changes) if delta is not None else None
        if delta is None or actions is None:
            return WriteResult()
        result = retried(
            lambda: self.writer.write_batch(delta, actions),
            is_transient,
            f"delta merge {delta.relative_path()}",
            self.retry,
        )
        if delta.history:
            retried(
                lambda: self.history.write(route, changes),
                is_transient,
                f"delta history merge {delta.history_relative_path()}",
                self.retry,
            )
        return result

    def truncate(self, route: TableRoute, truncate: Truncate) -> int:
        delta = route.delta
        if delta is None:
            return 0
        shape = route.shape(self.name)
        if marks_at_snapshot_end(shape, truncate):
            # A soft-delete table keeps the rows a re-snapshot no longer holds, marked (its
            # shape is not plain: it has no history, `mapping`).
            return retried(
                lambda: self.writer.mark_older(
                    delta, truncate.version, shape.markers[0], snapshot_end_marks(shape, truncate)
                ),
                is_transient,
                f"delta snapshot-end marks {delta.relative_path()}",
                self.retry,
            )
        removed = retried(
            lambda: self.writer.truncate(delta, truncate.version),
            is_transient,
            f"delta truncate {delta.relative_path()}",
            self.retry,
        )
        if delta.history:
            retried(
                lambda: self.history.truncate(route, truncate.version, truncate.source_ts_ms),
                is_transient,
                f"delta history truncate {delta.history_relative_path()}",
                self.retry,
            )
        return removed

    def record_watermark(self, routes: Mapping[str, TableRoute], position: int) -> None:
        retried(
            lambda: self.watermarks.record(routes, position),
            is_transient,
            "delta watermarks",
            self.retry,
        )

    def close(self) -> None:
        return None
