import dataclasses
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_sync.core.model import Change, Coordinates, Op, TableId
from cdc_sync.job.decode.fold import fold, order_key

pytestmark = pytest.mark.unit
TABLE = TableId("shop", "products")


def compact(changes: Iterable[Change]) -> list[Change]:
    """The reference model of a batch's fold: each key's changes folded in version order
    (what the job's sorted per-partition fold computes)."""
    latest: dict[tuple[TableId, tuple[object, ...]], Change] = {}
    for change in sorted(changes, key=order_key):
        slot = (change.table, change.key)
        previous = latest.get(slot)
        latest[slot] = change if previous is None else fold(previous, change)
    return list(latest.values())


def change(
    key: int,
    version: int,
    offset: int,
    op: Op = Op.UPDATE,
    row: dict[str, Any] | None = None,
    unavailable: frozenset[str] = frozenset(),
) -> Change:
    if op is not Op.DELETE and row is None:
        row = {"id": key, "v": version}
    return Change(
        TABLE,
        (("id", key),),
        op,
        version,
        None if op is Op.DELETE else row,
        Coordinates("t", 0, offset),
        unavailable_columns=unavailable,
    )


def test_newest_version_per_key_wins_whatever_the_input_order() -> None:
    changes = [change(1, 30, 2), change(1, 10, 0), change(2, 5, 1), change(1, 20, 3)]
    result = {c.doc_id: c.version for c in compact(changes)}
    assert result == {"1": 30, "2": 5}


def test_delete_after_update_wins_and_update_after_delete_wins() -> None:
    assert compact([change(1, 1, 0), change(1, 2, 1, Op.DELETE)])[0].is_delete
    assert not compact([change(1, 1, 0, Op.DELETE), change(1, 2, 1)])[0].is_delete


def test_duplicate_replay_of_the_same_change_keeps_one() -> None:
    assert len(compact([change(1, 7, 0), change(1, 7, 0)])) == 1


def test_unavailable_toast_column_is_filled_from_an_older_change_in_the_batch() -> None:
    full = change(1, 1, 0, row={"id": 1, "description": "long", "name": "a"})
    toast_only = change(1, 2, 1, row={"id": 1, "name": "b"}, unavailable=frozenset({"description"}))
    (result,) = compact([toast_only, full])
    assert result.row == {"id": 1, "name": "b", "description": "long"}
    assert result.unavailable_columns == frozenset()
    assert result.version == 2


def test_unavailable_column_stays_unavailable_when_the_batch_has_no_value() -> None:
    deleted = change(1, 1, 0, Op.DELETE)
    toast_only = change(1, 2, 1, row={"id": 1}, unavailable=frozenset({"description"}))
    (result,) = compact([deleted, toast_only])
    assert result.unavailable_columns == frozenset({"description"})


def test_an_uncertain_placeholder_is_never_filled_from_an_older_change() -> None:
    """A null in a float8[] column may be the placeholder or a real null set by this update:
    the older value may be gone, so the column is left for the read from Postgres."""
    full = change(1, 1, 0, row={"id": 1, "readings": [1.5], "name": "a"})
    nulled = dataclasses.replace(
        change(1, 2, 1, row={"id": 1, "name": "b"}, unavailable=frozenset({"readings"})),
        uncertain_columns=frozenset({"readings"}),
    )
    (result,) = compact([full, nulled])
    assert result.row == {"id": 1, "name": "b"}
    assert result.unavailable_columns == result.uncertain_columns == frozenset({"readings"})


@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 50)), max_size=40))
def test_compaction_equals_applying_every_change_in_version_order(
    events: list[tuple[int, int]],
) -> None:
    changes = [
        change(key, version, offset, Op.DELETE if version % 3 == 0 else Op.UPDATE)
        for offset, (key, version) in enumerate(events)
    ]
    state: dict[str, tuple[int, bool]] = {}
    for c in sorted(changes, key=lambda c: (c.version, c.coordinates.offset)):
        state[c.doc_id] = (c.version, c.is_delete)
    assert {c.doc_id: (c.version, c.is_delete) for c in compact(changes)} == state


@given(
    st.lists(
        st.tuples(st.sampled_from(["whole", "toast", "delete"]), st.integers(0, 3)),
        min_size=1,
        max_size=12,
    )
)
def test_a_folded_delete_carries_the_row_it_removes_when_the_batch_held_it_whole(
    events: list[tuple[str, int]],
) -> None:
    """`Change.deleted_row` (what a soft-delete sink's filter reads): the row the key held
    just before its delete, when the batch's changes tell it whole; None when they do not
    (the delete opens the batch, or a TOAST column of the row stayed unknown)."""
    changes = []
    state: tuple[str, dict[str, Any] | None] = ("unknown", None)
    for offset, (kind, value) in enumerate(events):
        version = offset + 1
        if kind == "delete":
            changes.append(change(1, version, offset, Op.DELETE))
            state = ("deleted", state[1] if state[0] in ("row", "deleted") else None)
        elif kind == "whole":
            row = {"id": 1, "v": value, "t": f"t{value}"}
            changes.append(change(1, version, offset, row=row))
            state = ("row", row)
        else:
            known = state[1] if state[0] == "row" else None
            changes.append(
                change(1, version, offset, row={"id": 1, "v": value}, unavailable=frozenset("t"))
            )
            state = ("row", {"id": 1, "v": value, "t": known["t"]}) if known else ("part", None)
    (result,) = compact(changes)
    if state[0] == "deleted":
        assert result.is_delete and result.deleted_row == state[1]
    else:
        assert not result.is_delete and result.deleted_row is None
