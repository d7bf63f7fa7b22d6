"""on_malformed holds at every stage: a record a sink refuses stops the batch under `fail`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import pytest

from cdc_sync.core.model import Change, Truncate
from cdc_sync.job.settle.applier import BatchApplier, BatchMetrics, PolicyViolation
from cdc_sync.job.settle.dead_letter import DeadLetter
from cdc_sync.mapping import OnMalformed, Policies, TableRoute
from cdc_sync.schema import RowSchema
from cdc_sync.sinks.base import RecordFailure, WriteResult
from tests.changes import change, mapping_of, products_route

pytestmark = pytest.mark.unit


class RefusingSink:
    """A sink whose target refuses every record (e.g. a mapping conflict in the index)."""

    name = "search"

    def ensure_target(self, route: TableRoute, schema: RowSchema | None) -> None:
        return None

    def truncate(self, route: TableRoute, truncate: Truncate) -> int:
        return 0

    def apply(self, route: TableRoute, changes: Sequence[Change]) -> WriteResult:
        failures = [RecordFailure(c, "mapper_parsing_exception", "refused") for c in changes]
        return WriteResult(failures=failures)

    def record_watermark(self, routes: Mapping[str, TableRoute], position: int) -> None:
        return None

    def close(self) -> None:
        return None


class Letters:
    def __init__(self) -> None:
        self.written: list[DeadLetter] = []

    def write(self, letters: Sequence[DeadLetter], batch_id: int | None = None) -> None:
        self.written += letters


def applier_for(policy: OnMalformed) -> tuple[BatchApplier, Letters, Change]:
    route = dataclasses.replace(products_route(), policies=Policies(on_malformed=policy))
    mapping = mapping_of(route)
    letters = Letters()
    applier = BatchApplier(mapping, [RefusingSink()], letters)  # type: ignore[arg-type]
    row = {"id": 1, "sku": "s1", "name": "n", "description": None, "price": None, "in_stock": True}
    return applier, letters, change(route, "c", 100, 1, row)


def apply(applier: BatchApplier, one: Change) -> None:
    applier.apply(
        1, records=1, changes=1, compacted=[one], rejected=[], schemas={}, schema_fps=[None]
    )


def test_fail_stops_on_a_record_the_sink_refuses_naming_the_setting() -> None:
    applier, letters, one = applier_for(OnMalformed.FAIL)
    with pytest.raises(
        PolicyViolation, match=r"search refused 1 record.*on_malformed\)?: dead_letter"
    ):
        apply(applier, one)
    assert letters.written == []


def test_dead_letter_keeps_going_and_letters_the_refused_record() -> None:
    applier, letters, one = applier_for(OnMalformed.DEAD_LETTER)
    apply(applier, one)
    assert [(d.sink, d.stage, d.error_class) for d in letters.written] == [
        ("search", "write", "mapper_parsing_exception")
    ]


def test_every_batch_reports_its_stage_times() -> None:
    applier, _, one = applier_for(OnMalformed.DEAD_LETTER)
    metrics = applier.apply(
        1,
        records=1,
        changes=1,
        compacted=[one],
        rejected=[],
        schemas={},
        schema_fps=[None],
        stage_seconds={"decode": 0.5, "fold": 0.25},
    )
    assert {"decode", "fold", "search", "dead_letter"} <= set(metrics.stages)
    assert "decode:0.50s" in metrics.summary() and "search:" in metrics.summary()


def test_observers_see_each_applied_batch_with_offsets_and_table_progress() -> None:
    """Metrics, watermarks and status hang off this hook: it runs once per applied batch, after
    every sink acknowledged, with the newest version and commit time per table."""
    applier, _, one = applier_for(OnMalformed.DEAD_LETTER)
    seen: list[BatchMetrics] = []
    applier.observers.append(seen.append)
    newer = dataclasses.replace(one, version=250, source_ts_ms=1_700_000_000_000)
    applier.apply(
        7,
        records=2,
        changes=2,
        compacted=[one, newer],
        rejected=[],
        schemas={},
        schema_fps=[None, None],
        offsets={("cdc.shop.products", 0): 41},
    )
    assert [m.batch_id for m in seen] == [7]
    progress = seen[0].tables[one.table]
    assert (progress.changes, progress.max_version) == (2, 250)
    assert progress.max_source_ts_ms == 1_700_000_000_000
    assert seen[0].offsets == {("cdc.shop.products", 0): 41}


def test_a_failed_batch_is_not_observed() -> None:
    applier, _, one = applier_for(OnMalformed.FAIL)
    seen: list[BatchMetrics] = []
    applier.observers.append(seen.append)
    with pytest.raises(PolicyViolation):
        apply(applier, one)
    assert seen == []
