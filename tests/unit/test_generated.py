"""Stored generated columns (job.write.generated): put back where the catalog has them, so a
streamed change's schema (without them) and a snapshot row's (with them) are one schema, and marked
for reading back only when a change lacks them."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_sync.core.model import Change, Coordinates, Op, TableId
from cdc_sync.core.types import Column, ColumnType, RowSchema, TypeKind
from cdc_sync.job.write.generated import TableGenerated

pytestmark = pytest.mark.unit
INT = ColumnType(TypeKind.INT32)


def schema(names: list[str]) -> RowSchema:
    return RowSchema(tuple(Column(name, INT) for name in names))


@given(st.lists(st.booleans(), min_size=1, max_size=12))
def test_generated_columns_go_back_to_their_catalog_place(generated_flags: list[bool]) -> None:
    order = [f"c{i}" for i in range(len(generated_flags))]
    generated = [n for n, g in zip(order, generated_flags, strict=True) if g]
    table = TableGenerated(tuple(order), tuple(Column(n, INT) for n in generated))
    published = schema([n for n in order if n not in generated])
    assert table.complete(published) == schema(order)
    assert table.complete(schema(order)) == schema(order)  # a snapshot row's: as it is


def test_only_a_change_lacking_the_column_reads_it_back() -> None:
    table = TableGenerated(("id", "price", "cents"), (Column("price", INT),))
    accepted = schema(["id", "price", "cents"])
    streamed = Change(
        TableId("s", "t"), (("id", 1),), Op.UPDATE, 7, {"id": 1, "cents": 250},
        Coordinates("p.s.t", 0, 7), schema=schema(["id", "cents"]),
    )  # fmt: skip
    marked = table.unpublished(streamed, accepted)
    assert marked.unavailable_columns == {"price"} and marked.schema == accepted
    snapshot = dataclasses.replace(streamed, row={"id": 1, "price": 2, "cents": 250})
    assert table.unpublished(snapshot, accepted) is snapshot
    # A table whose accepted schema does not have the column (`ignore` kept it out): not read.
    assert table.unpublished(streamed, schema(["id", "cents"])) is streamed
