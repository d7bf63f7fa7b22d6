"""Search actions without a server: versioned bulk lines, ids, partial TOAST docs, deletes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from cdc_sync.sinks.search.actions import bulk_operations, concrete_index, to_actions
from cdc_sync.sinks.search.client import bulk_chunks, classify_items
from cdc_sync.sinks.search.target import index_settings, initial_mappings
from tests.changes import change, products_route
from tests.envelopes import UNAVAILABLE, field, product

pytestmark = pytest.mark.unit
ROUTE = products_route(index="products")


MARK_FIELDS = [field("id", "int32", optional=False), field("_deleted", "boolean")]


def test_upserts_and_deletes_are_versioned_external_gte_by_lsn() -> None:
    actions = to_actions(ROUTE, [change(ROUTE, "u", 30, 1, product(1)), change(ROUTE, "d", 40, 2)])
    assert actions is not None and actions.alias == "products"
    lines = bulk_operations(concrete_index("products"), actions.actions)
    assert lines[0] == {
        "index": {
            "_index": "products_v1",
            "_id": "1",
            "version": 30,
            "version_type": "external_gte",
        }
    }
    assert lines[1]["price"] == "89.90"  # exact decimal text, not a float
    assert lines[2] == {
        "delete": {
            "_index": "products_v1",
            "_id": "2",
            "version": 40,
            "version_type": "external_gte",
        }
    }
    assert len(lines) == 3  # deletes carry no document


def test_unchanged_toast_fields_are_left_out_then_filled_from_the_stored_doc() -> None:
    row = product(1, description=UNAVAILABLE)
    actions = to_actions(ROUTE, [change(ROUTE, "u", 50, 1, row)])
    assert actions is not None
    action = actions.actions[0]
    assert action.unavailable_fields == {"description"}
    assert action.document is not None and "description" not in action.document
    filled = action.with_stored_fields({"description": "stored text", "name": "old name"})
    assert filled.document is not None
    assert filled.document["description"] == "stored text"
    assert filled.document["name"] == "Keyboard"  # the change's own fields win


def test_a_mark_is_written_over_the_stored_document_or_sent_as_the_delete() -> None:
    """A soft delete (`Change.marks_deleted`) marks only a document the index holds."""
    marked = replace(
        change(ROUTE, "u", 60, 1, {"id": 1, "_deleted": True}, fields=MARK_FIELDS),
        marks_deleted=True,
    )
    actions = to_actions(ROUTE, [marked])
    assert actions is not None
    (action,) = actions.actions
    assert action.op == "index" and action.mark and action.version == 60
    over = action.over_stored({"id": 1, "name": "kept", "_deleted": False})
    assert (over.op, over.mark) == ("index", False)
    assert over.document == {"id": 1, "name": "kept", "_deleted": True}
    gone = action.over_stored(None)
    assert (gone.op, gone.version, gone.document) == ("delete", 60, None)


def test_no_route_or_no_changes_means_no_actions() -> None:
    assert to_actions(ROUTE, []) is None


def test_bulk_items_classify_into_applied_fenced_failed_and_retry() -> None:
    changes = [change(ROUTE, "u", lsn, lsn, product(lsn)) for lsn in (1, 2, 3, 4)]
    changes.append(change(ROUTE, "d", 5, 5))
    actions = to_actions(ROUTE, changes)
    assert actions is not None
    items: list[dict[str, Any]] = [
        {"index": {"status": 201}},
        {"index": {"status": 409, "error": {"type": "version_conflict_engine_exception"}}},
        {"index": {"status": 400, "error": {"type": "mapper_parsing_exception"}}},
        {"index": {"status": 429}},
        {"delete": {"status": 404}},  # already gone: the versioned delete still counts
    ]
    result, retry = classify_items(actions.actions, items)
    assert (result.applied, result.fenced) == (2, 1)
    assert [f.error_class for f in result.failures] == ["mapper_parsing_exception"]
    assert [a.doc_id for a in retry] == ["4"]


def test_index_settings_carry_the_tombstone_retention_as_gc_deletes() -> None:
    assert index_settings(ROUTE.search, 3600)["index"]["gc_deletes"] == "3600s"  # type: ignore[arg-type]


def test_route_mapping_wins_and_schema_columns_fill_the_rest() -> None:
    schema = change(ROUTE, "c", 1, 1, product(1)).schema
    mappings = initial_mappings(ROUTE.search, schema)  # type: ignore[arg-type]
    assert mappings["properties"]["id"] == {"type": "integer"}  # from the route
    assert mappings["properties"]["in_stock"] == {"type": "boolean"}  # derived
    assert mappings["properties"]["price"] == {"type": "double"}


def test_bulk_requests_are_bounded_by_count_and_by_bytes() -> None:
    route = products_route()
    big = "x" * 40_000
    changes = [change(route, "c", 10 + i, i, product(i, description=big)) for i in range(1, 8)]
    actions = to_actions(route, changes)
    assert actions is not None
    by_bytes = [len(c) for c in bulk_chunks(actions.actions, count=500, size=100_000)]
    assert by_bytes == [2, 2, 2, 1]  # ~40 kB a document: two fit under 100 kB
    by_count = [len(c) for c in bulk_chunks(actions.actions, count=3, size=10**9)]
    assert by_count == [3, 3, 1]  # 3 runs, of ceil(7 / 3)
    six = [len(c) for c in bulk_chunks(actions.actions[:6], count=5, size=10**9)]
    assert six == [3, 3]  # not 5 and a rest of 1
    assert [len(c) for c in bulk_chunks(actions.actions[:1], count=3, size=10)] == [1]
