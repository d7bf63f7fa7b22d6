"""The driver's once-per-table commits (Delta) of one batch run side by side, not one after the
other: a batch then waits for its slowest table, not for the sum of its tables."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping, Sequence

import pytest

from cdc_sync.core.model import Change, TableId, Truncate
from cdc_sync.job.settle.applier import PARALLEL_COMMITS, BatchApplier, BatchMetrics
from cdc_sync.mapping import TableRoute
from cdc_sync.schema import RowSchema
from cdc_sync.sinks.base import WriteResult
from tests.changes import mapping_of, products_route

pytestmark = pytest.mark.unit

TABLES = [TableId("shop", name) for name in ("customers", "orders", "products")]


class MeetingSink:
    """Each table's commit waits until every table's commit has started: only commits that
    run at the same time get past the barrier."""

    name = "delta"

    def __init__(self, tables: int) -> None:
        self.barrier = threading.Barrier(tables, timeout=5)

    def ensure_target(self, route: TableRoute, schema: RowSchema | None) -> None:
        return None

    def truncate(self, route: TableRoute, truncate: Truncate) -> int:
        return 0

    def apply(self, route: TableRoute, changes: Sequence[Change]) -> WriteResult:
        self.barrier.wait()
        return WriteResult(applied=len(changes))

    def record_watermark(self, routes: Mapping[str, TableRoute], position: int) -> None:
        return None

    def close(self) -> None:
        return None


class FailingSink(MeetingSink):
    def apply(self, route: TableRoute, changes: Sequence[Change]) -> WriteResult:
        super().apply(route, changes)
        if route.table == TABLES[1]:
            raise OSError("disk full")
        return WriteResult()


def applier() -> BatchApplier:
    routes = [dataclasses.replace(products_route(), table=table) for table in TABLES]
    return BatchApplier(mapping_of(*routes), [], None)


def test_the_tables_of_a_batch_commit_at_the_same_time() -> None:
    sink = MeetingSink(len(TABLES))
    committed = applier()._commit([sink], {t: {"delta": []} for t in TABLES}, BatchMetrics(1))
    assert sorted(committed) == [(t, "delta") for t in TABLES]
    assert not sink.barrier.broken


def test_a_failed_commit_fails_the_batch_after_the_others_ended() -> None:
    sink = FailingSink(len(TABLES))
    with pytest.raises(OSError, match="disk full"):
        applier()._commit([sink], {t: {"delta": []} for t in TABLES}, BatchMetrics(1))
    assert sink.barrier.n_waiting == 0  # no commit left running


def test_the_batches_of_an_applier_commit_on_the_same_threads() -> None:
    """A batch's own pool started and joined its threads every batch (a tenth of a small batch's
    time on a busy driver): five batches of three tables commit on the applier's few threads
    (at most PARALLEL_COMMITS), not on three new ones each."""
    threads: list[threading.Thread] = []  # kept alive: a new thread is a new object

    class ThreadRecordingSink(MeetingSink):
        def apply(self, route: TableRoute, changes: Sequence[Change]) -> WriteResult:
            threads.append(threading.current_thread())
            return super().apply(route, changes)

    sink, kept = ThreadRecordingSink(len(TABLES)), applier()
    for batch_id in range(1, 6):
        kept._commit([sink], {t: {"delta": []} for t in TABLES}, BatchMetrics(batch_id))
    assert len(threads) == 5 * len(TABLES) and len(set(threads)) <= PARALLEL_COMMITS
