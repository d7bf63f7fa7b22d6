"""SCD type 2 history recomputation (sinks.delta.history): replays, duplicates, batches out of
order and deletes give the rows that applying the log once, in order, gives."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_sync.core.model import Change, Coordinates, Op, TableId
from cdc_sync.job.decode.fold import fold_key
from cdc_sync.sinks.delta.history import (
    IS_CURRENT,
    VERSION_FROM,
    VERSION_LAST,
    VERSION_TO,
    Version,
    interval_problems,
    recompute,
    stored_version,
)

pytestmark = pytest.mark.unit

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def at(version: int) -> datetime:
    return EPOCH + timedelta(seconds=version)


def version(v: int, op: str, price: int | None = None, name: str | None = None) -> Version:
    row: dict[str, Any] = {"id": 1} if op == "d" else {"id": 1, "price": price, "name": name}
    return Version(v, op, at(v), row)


def apply(
    rows: list[dict[str, Any]], batch: list[Version], track: frozenset[str] | None
) -> list[dict[str, Any]]:
    return recompute("1", [stored_version(r) for r in rows], batch, track)


def in_order(log: list[Version], track: frozenset[str] | None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for entry in log:
        rows = apply(rows, [entry], track)
    return rows


@st.composite
def logs(draw: st.DrawFn) -> list[Version]:
    """One key's log: inserts when absent, updates and deletes when present, rising versions;
    prices and names from small sets, so updates of untracked columns and no-op updates occur."""
    entries: list[Version] = []
    present = False
    v = 0
    for _ in range(draw(st.integers(1, 12))):
        v += draw(st.integers(1, 3))
        if present and draw(st.booleans()) and draw(st.booleans()):
            entries.append(version(v, "d"))
            present = False
            continue
        op = "u" if present else draw(st.sampled_from(["c", "r"]))
        entries.append(version(v, op, draw(st.integers(1, 3)), draw(st.sampled_from("ab"))))
        present = True
    return entries


@st.composite
def deliveries(draw: st.DrawFn, log: list[Version]) -> list[list[Version]]:
    """Batches as a consumer of the log sees them: contiguous ranges that never skip past what
    it read (a restart or a replay starts at or before it), repeated records, and older ranges
    again after newer ones; the last batches reach the log's end."""
    batches: list[list[Version]] = []
    read = 0
    while read < len(log) or (draw(st.booleans()) and len(batches) < 8):
        start = draw(st.integers(0, min(read, len(log) - 1)))
        end = draw(st.integers(start + 1, len(log)))
        chunk = log[start:end]
        repeated = draw(st.lists(st.sampled_from(chunk), max_size=3))
        batches.append(sorted([*chunk, *repeated], key=lambda e: e.version))
        read = max(read, end)
    return batches


TRACKS = st.sampled_from([None, frozenset({"price"}), frozenset({"price", "name"})])


@settings(max_examples=300, deadline=None)
@given(data=st.data(), track=TRACKS)
def test_replays_duplicates_and_older_batches_after_newer_ones_give_the_in_order_history(
    data: st.DataObject, track: frozenset[str] | None
) -> None:
    log = data.draw(logs())
    rows: list[dict[str, Any]] = []
    for batch in data.draw(deliveries(log)):
        rows = apply(rows, batch, track)
    assert rows == in_order(log, track)
    assert interval_problems(rows) == []


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_every_column_tracked_and_distinct_versions_converge_in_any_order(
    data: st.DataObject,
) -> None:
    """With no `track` a version opens a row unless it changes nothing; when every version
    differs, any order and any grouping of batches gives the same rows."""
    raw = data.draw(logs())
    log = [e if e.op == "d" else version(e.version, e.op, e.version, "a") for e in raw]
    order = data.draw(st.permutations(log))
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(order) - 1)), max_size=4)))
    rows: list[dict[str, Any]] = []
    for start, end in zip([0, *cuts], [*cuts, len(order)], strict=True):
        if order[start:end]:
            rows = apply(rows, list(order[start:end]), None)
    assert rows == in_order(log, None)


def test_untracked_changes_update_the_current_row_in_place() -> None:
    track = frozenset({"price"})
    rows = in_order(
        [version(1, "c", 10, "a"), version(2, "u", 10, "b"), version(3, "u", 20, "b")], track
    )
    assert [(r[VERSION_FROM], r[VERSION_LAST], r[VERSION_TO], r["name"]) for r in rows] == [
        (1, 2, 3, "b"),
        (3, 3, None, "b"),
    ]
    assert [r[IS_CURRENT] for r in rows] == [False, True]


def test_a_delete_closes_the_interval_with_the_last_values_and_a_reinsert_opens_one() -> None:
    rows = in_order([version(1, "c", 10, "a"), version(4, "d"), version(6, "c", 30, "z")], None)
    assert [(r["_cdc_op"], r[VERSION_FROM], r[VERSION_TO], r["price"]) for r in rows] == [
        ("c", 1, 4, 10),
        ("d", 4, 6, 10),
        ("c", 6, None, 30),
    ]
    assert rows[1]["_valid_from"] == at(4) and rows[1]["_valid_to"] == at(6)
    assert [r[IS_CURRENT] for r in rows] == [False, False, True]


def test_unchanged_toast_columns_come_from_the_version_before() -> None:
    later = Version(2, "u", at(2), {"id": 1, "price": 11}, unavailable=frozenset({"name"}))
    rows = apply(in_order([version(1, "c", 10, "long text")], None), [later], None)
    assert rows[-1]["name"] == "long text"


def change(v: int, offset: int, row: dict[str, Any]) -> Change:
    coordinates = Coordinates("shop.public.products", 0, offset)
    return Change(TableId("public", "products"), (("id", 1),), Op.UPDATE, v, row, coordinates)


def test_a_batch_keeps_one_state_per_version_the_last_of_its_transaction() -> None:
    changes = [
        change(5, 0, row={"id": 1, "price": 1}),
        change(5, 1, row={"id": 1, "price": 2}),
        change(7, 2, row={"id": 1, "price": 3}),
        change(9, 3, row={"id": 1, "price": 4}),
    ]
    state = fold_key(changes, keep_earlier=True)
    assert [(c.version, c.row) for c in state.earlier] == [
        (5, {"id": 1, "price": 2}),
        (7, {"id": 1, "price": 3}),
    ]
    assert fold_key(changes).earlier == ()


def test_verify_finds_gaps_overlaps_and_wrong_current_flags() -> None:
    rows = in_order([version(1, "c", 1), version(2, "u", 2), version(3, "u", 3)], None)
    assert interval_problems(rows) == []
    gap = [dict(rows[0], **{VERSION_TO: 9}), *rows[1:]]
    assert interval_problems(gap) == ["version 1 does not end where 2 starts"]
    two_current = [dict(rows[0], **{IS_CURRENT: True}), *rows[1:]]
    assert interval_problems(two_current) == ["version 1 is current but not the newest"]


def tombstone() -> Version:
    """A compacted topic's tombstone alone in its batch: a delete without a version."""
    return Version(-1, "d", None, {"id": 1})


def test_a_tombstone_without_a_version_closes_the_newest_row_just_after_it() -> None:
    rows = in_order([version(1, "c", 10, "a"), version(5, "u", 20, "a")], None)
    closed = apply(rows, [tombstone()], None)
    assert [(r["_cdc_op"], r[VERSION_FROM], r["price"], r["_valid_from"]) for r in closed][-1] == (
        "d",
        6,
        20,
        None,  # the commit time is unknown
    )
    assert not any(r[IS_CURRENT] for r in closed) and interval_problems(closed) == []
    assert apply(closed, [tombstone()], None) == closed  # the tombstone again: nothing new
    later = apply(closed, [version(9, "c", 30, "b")], None)  # written again later: a version
    assert [(r["_cdc_op"], r[VERSION_FROM]) for r in later] == [
        ("c", 1),
        ("u", 5),
        ("d", 6),
        ("c", 9),
    ]


def test_a_stale_tombstone_replayed_before_the_versions_after_it_is_undone_by_them() -> None:
    log = [version(1, "c", 10, "a"), version(3, "d"), version(9, "c", 30, "b")]
    rows = in_order(log, None)
    # A replay of a compacted topic: the key's tombstone, then the record that followed it.
    replayed = apply(apply(rows, [tombstone()], None), [log[2]], None)
    assert replayed == rows
