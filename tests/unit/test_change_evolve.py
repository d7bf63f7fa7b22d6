"""`Change.evolve` (the per-record paths' copy with fields set) makes what `dataclasses.replace`
makes, and a route's projected schema is one object per table schema."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_sync.core.model import Change, Coordinates, Op, TableId
from cdc_sync.core.types import Column, ColumnType, RowSchema, TypeKind
from tests.changes import products_route

pytestmark = pytest.mark.unit
FIELD_NAMES = [f.name for f in dataclasses.fields(Change)]
SCHEMA = RowSchema(
    (Column("id", ColumnType(TypeKind.INT64)), Column("sku", ColumnType(TypeKind.STRING)))
)


def base(row: dict[str, Any] | None) -> Change:
    return Change(
        TableId("shop", "products"),
        (("id", 1),),
        Op.UPDATE if row is not None else Op.DELETE,
        7,
        row,
        Coordinates("cdc.shop.products", 0, 3),
        schema=SCHEMA,
    )


updates = st.fixed_dictionaries(
    {},
    optional={
        "version": st.integers(-1, 2**62),
        "row": st.none() | st.dictionaries(st.text(max_size=5), st.integers(), max_size=4),
        "schema": st.none() | st.just(SCHEMA),
        "unavailable_columns": st.frozensets(st.text(max_size=5), max_size=3),
        "transaction": st.none() | st.integers(0, 2**40),
        "ends_snapshot": st.booleans(),
        "marks_deleted": st.booleans(),
        "earlier": st.just(()) | st.just((base({"id": 1}),)),
    },
)


@given(st.none() | st.just({"id": 1, "sku": "a"}), updates)
def test_evolve_makes_what_replace_makes(
    row: dict[str, Any] | None, changes: dict[str, Any]
) -> None:
    change = base(row)
    evolved = change.evolve(**changes)
    replaced = dataclasses.replace(change, **changes)
    # Every field, compared or not (schema, earlier, deleted_row are compare=False).
    for name in FIELD_NAMES:
        assert getattr(evolved, name) is getattr(replaced, name) or (
            getattr(evolved, name) == getattr(replaced, name)
        ), name
    assert evolved == replaced and type(evolved) is Change
    assert pickle.loads(pickle.dumps(evolved)) == replaced
    assert change == base(row) and change.schema is SCHEMA  # the original is untouched


def test_evolve_refuses_a_name_that_is_not_a_field() -> None:
    with pytest.raises(TypeError, match="no field"):
        base(None).evolve(vresion=3)


def test_evolved_changes_stay_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        base(None).evolve(version=3).version = 4  # type: ignore[misc]


def test_a_route_projects_each_table_schema_once() -> None:
    route = products_route()
    first = route.route(base({"id": 1, "sku": "a"}))
    second = route.route(base({"id": 2, "sku": "b"}).evolve(schema=RowSchema(SCHEMA.columns)))
    # One object per table schema (by its fingerprint): pickled once with a batch's changes.
    assert first.schema is second.schema
    other = RowSchema((*SCHEMA.columns, Column("name", ColumnType(TypeKind.STRING))))
    third = route.route(base({"id": 3, "sku": "c", "name": "n"}).evolve(schema=other))
    assert third.schema is not first.schema
    assert third.schema == route.project_schema(other) and "name" in third.schema.names


def test_change_has_no_post_init_for_evolve_to_skip() -> None:
    # evolve builds the copy without __init__: a __post_init__ added to Change (a check, a
    # derived field) would be skipped by it, and evolve must then call it.
    assert not hasattr(Change, "__post_init__")


@given(st.none() | st.just({"id": 1, "sku": "a"}), updates, st.sampled_from(list(Op)))
def test_a_pickled_change_loads_with_every_field_as_it_was(
    row: dict[str, Any] | None, changes: dict[str, Any], op: Op
) -> None:
    """`Change.__reduce__` pickles plain values, not the fields by name: every field comes
    back, those equality skips (schema, earlier, deleted_row) too, and the loaded change is a
    frozen `Change` like any other."""
    change = base(row).evolve(op=op, deleted_row=row, **changes)
    loaded = pickle.loads(pickle.dumps(change, protocol=5))
    assert type(loaded) is Change and loaded == change
    for name in FIELD_NAMES:
        assert getattr(loaded, name) == getattr(change, name), name
    assert loaded.op is op and type(loaded.table) is TableId
    assert type(loaded.coordinates) is Coordinates and loaded.coordinates == change.coordinates
    assert [field.name for field in dataclasses.fields(loaded)] == FIELD_NAMES
    with pytest.raises(dataclasses.FrozenInstanceError):
        loaded.version = 1  # type: ignore[misc]
