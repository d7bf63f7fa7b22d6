"""The SCD type 2 history table on real Delta files (deltalake): versions, untracked updates in
place, delete and re-insert, TRUNCATE, and replays that leave the table as it is."""

from __future__ import annotations

import dataclasses
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc_sync.core.model import Change, TableId, Truncate
from cdc_sync.job.decode.fold import fold_key
from cdc_sync.mapping import DeltaRoute, Policies, TableRoute
from cdc_sync.sinks.delta import DeltaSink
from cdc_sync.sinks.delta.history import ID, interval_problems
from cdc_sync.sinks.delta.history_writer import _stored_rows
from cdc_sync.sinks.delta.readback import history_rows
from tests.changes import change as routed_change
from tests.envelopes import PRODUCT_FIELDS, coords, field, product

pytestmark = pytest.mark.integration

ROUTE = TableRoute(
    table=TableId("shop", "products"),
    columns=None,
    rename={},
    search=None,
    cache=None,
    delta=DeltaRoute("shop", "products", history=True, track=("price",)),
    policies=Policies(),
)


def change(op: str, lsn: int, key: int, after: dict[str, Any] | None = None) -> Change:
    made = routed_change(ROUTE, op, lsn, key, after)
    return dataclasses.replace(made, source_ts_ms=lsn * 1000)


def batch(*changes: Change) -> list[Change]:
    """A micro-batch as the fold leaves it for a history table: one change per key."""
    by_key: dict[str, list[Change]] = {}
    for c in changes:
        by_key.setdefault(c.doc_id, []).append(c)
    return [fold_key(group, keep_earlier=True) for group in by_key.values()]


def history(warehouse: Path) -> list[tuple[Any, ...]]:
    assert ROUTE.delta is not None
    rows = sorted(history_rows(warehouse, ROUTE.delta), key=lambda r: r["_cdc_version_from"])
    return [
        (
            r["_cdc_op"],
            r["_cdc_version_from"],
            r["_cdc_version"],
            r["_cdc_version_to"],
            r["name"],
            r["price"],
            r["_is_current"],
        )
        for r in rows
    ]


def test_history_table_records_versions_and_replays_change_nothing(tmp_path: Path) -> None:
    sink = DeltaSink(tmp_path, tombstone_retention_seconds=3600)
    first = batch(
        change("c", 100, 1, product(1, price="10.00")),
        change("u", 200, 1, product(1, name="Renamed", price="10.00")),  # untracked: in place
        change("u", 300, 1, product(1, name="Renamed", price="20.00")),
    )
    sink.ensure_target(ROUTE, first[0].schema)
    sink.apply(ROUTE, first)
    second = batch(change("d", 400, 1), change("c", 500, 1, product(1, price="30.00")))
    sink.apply(ROUTE, second)
    expected = [
        ("c", 100, 200, 300, "Renamed", Decimal("10.00"), False),
        ("u", 300, 300, 400, "Renamed", Decimal("20.00"), False),
        ("d", 400, 400, 500, "Renamed", Decimal("20.00"), False),
        ("c", 500, 500, None, "Keyboard", Decimal("30.00"), True),
    ]
    assert history(tmp_path) == expected
    path = tmp_path / ROUTE.delta.history_relative_path()  # type: ignore[union-attr]
    version = DeltaTable(str(path)).version()
    for replayed in (first, second, second, first):  # replays, older batches after newer ones
        sink.apply(ROUTE, replayed)
    assert history(tmp_path) == expected
    assert DeltaTable(str(path)).version() == version  # nothing to rewrite: no commit
    rows = history_rows(tmp_path, ROUTE.delta)  # type: ignore[arg-type]
    assert interval_problems(rows) == []
    valid = {r["_cdc_version_from"]: (r["_valid_from"], r["_valid_to"]) for r in rows}
    assert valid[300][1] == valid[400][0]  # the delete's commit time closes the version


def test_a_truncate_closes_the_current_versions(tmp_path: Path) -> None:
    sink = DeltaSink(tmp_path, tombstone_retention_seconds=3600)
    first = batch(change("c", 100, 1, product(1)), change("c", 100, 2, product(2)))
    sink.ensure_target(ROUTE, first[0].schema)
    sink.apply(ROUTE, first)
    sink.truncate(ROUTE, Truncate(ROUTE.table, 200, coords(200), 200, 200_000))
    ops = [(r[0], r[1], r[6]) for r in history(tmp_path)]
    assert sorted(ops) == [
        ("c", 100, False),
        ("c", 100, False),
        ("t", 200, False),
        ("t", 200, False),
    ]


def test_a_snapshot_end_keeps_a_row_the_snapshot_merged_in_place(tmp_path: Path) -> None:
    """A re-snapshot's row equal to the current version is merged into it in place (its
    `_cdc_version` rises, `_cdc_version_from` stays); the snapshot's end, a TRUNCATE at the
    snapshot's version, must not close it. It did: the adversarial re-snapshot found keys
    missing from the history's current rows."""
    sink = DeltaSink(tmp_path, tombstone_retention_seconds=3600)
    first = batch(change("c", 100, 1, product(1)), change("c", 100, 2, product(2)))
    sink.ensure_target(ROUTE, first[0].schema)
    sink.apply(ROUTE, first)
    sink.apply(ROUTE, batch(change("r", 300, 1, product(1))))  # key 2 was deleted unseen
    sink.truncate(ROUTE, Truncate(ROUTE.table, 300, coords(300), None, 300_000, snapshot_end=True))
    current = sorted((r[0], r[1], r[6]) for r in history(tmp_path) if r[6])
    assert current == [("c", 100, True)]  # key 1 stays current; key 2 is closed
    assert sorted(r[0] for r in history(tmp_path)) == ["c", "c", "t"]


def test_history_turned_on_later_starts_with_the_next_versions(tmp_path: Path) -> None:
    sink = DeltaSink(tmp_path, tombstone_retention_seconds=3600)
    plain = dataclasses.replace(ROUTE, delta=DeltaRoute("shop", "products"))
    first = batch(change("c", 100, 1, product(1, price="10.00")))
    sink.ensure_target(plain, first[0].schema)
    sink.apply(plain, first)
    # The mapping now asks for history; the schema did not change, so no ensure_target.
    sink.apply(ROUTE, batch(change("u", 200, 1, product(1, price="20.00"))))
    assert history(tmp_path) == [("u", 200, 200, None, "Keyboard", Decimal("20.00"), True)]


def test_a_widened_number_column_is_widened_in_the_history_too(tmp_path: Path) -> None:
    sink = DeltaSink(tmp_path, tombstone_retention_seconds=3600)
    narrow = [*PRODUCT_FIELDS, field("stock", "int32")]
    wide = [*PRODUCT_FIELDS, field("stock", "int64")]
    first = [routed_change(ROUTE, "c", 100, 1, product(1) | {"stock": 5}, narrow)]
    sink.ensure_target(ROUTE, first[0].schema)
    sink.apply(ROUTE, batch(*first))
    second = [routed_change(ROUTE, "u", 200, 1, product(1, price="2.00") | {"stock": 2**40}, wide)]
    sink.ensure_target(ROUTE, second[0].schema)
    sink.apply(ROUTE, batch(*second))
    path = tmp_path / ROUTE.delta.history_relative_path()  # type: ignore[union-attr]
    data = DeltaTable(str(path)).to_pyarrow_table()
    assert data.schema.field("stock").type == pa.int64()
    assert sorted(data["stock"].to_pylist()) == [5, 2**40]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    held=st.lists(st.text(max_size=12), min_size=1, max_size=6, unique=True),
    asked=st.lists(st.text(max_size=6), max_size=4),
    data=st.data(),
)
def test_the_rows_of_the_changed_keys_are_found_whatever_their_ids_hold(
    tmp_path: Path, held: list[str], asked: list[str], data: st.DataObject
) -> None:
    """The rows of a batch's keys are filtered in a query (DataFusion SQL, ids as quoted
    literals): quotes, backslashes, NULs and any text in a key find exactly that key's rows."""
    path = tmp_path / uuid.uuid4().hex  # one table an example (tmp_path is the test's)
    write_deltalake(
        str(path), pa.table({ID: pa.array(held), "n": pa.array(range(len(held)), pa.int64())})
    )
    wanted = data.draw(st.lists(st.sampled_from(held), max_size=4)) + asked
    found = _stored_rows(DeltaTable(str(path)), wanted)
    expected = {doc_id: [{ID: doc_id, "n": n}] for n, doc_id in enumerate(held) if doc_id in wanted}
    assert dict(found) == expected
