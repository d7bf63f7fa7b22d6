from decimal import Decimal

import pytest

from cdc_sync.core.model import Change, Coordinates, Op, TableId
from cdc_sync.debezium.decoder import parse_record
from cdc_sync.mapping import CacheRoute, DeltaRoute, Policies, TableRoute
from cdc_sync.sinks.delta.actions import DELETED, VERSION, keep_flag, to_actions
from cdc_sync.sinks.delta.merge_plan import datafusion_quote, merge_plan
from tests.envelopes import UNAVAILABLE, coords, envelope_bytes, key_bytes, product

pytestmark = pytest.mark.unit
ROUTE = TableRoute(
    table=TableId("shop", "products"),
    columns=None,
    rename={},
    search=None,
    cache=CacheRoute("cache"),
    delta=DeltaRoute("shop", "products"),
    policies=Policies(),
)


def parsed(op: str, lsn: int, after: dict | None, offset: int = 0) -> Change:
    change = parse_record(
        key_bytes("products", {"id": 1 if after is None else after["id"]}),
        envelope_bytes("products", op, lsn, after),
        coords(offset),
    )
    assert isinstance(change, Change)
    return ROUTE.route(change)


def test_merge_source_holds_typed_columns_metadata_and_delete_flags() -> None:
    actions = to_actions(ROUTE, [parsed("c", 10, product(1, price="1.50")), parsed("d", 11, None)])
    assert actions is not None
    source = actions.source
    assert source.column("price").to_pylist() == [Decimal("1.50"), None]
    assert source.column("id").to_pylist() == [1, 1]  # key columns from the key, deletes too
    assert source.column(VERSION).to_pylist() == [10, 11]
    assert source.column(DELETED).to_pylist() == [False, True]
    assert actions.deleted_ids == [("1", 11)]


def test_unavailable_toast_column_gets_a_keep_flag_and_a_case_update() -> None:
    toast = parsed("u", 12, product(2) | {"description": UNAVAILABLE})
    fresh = parsed("u", 13, product(3))
    actions = to_actions(ROUTE, [toast, fresh])
    assert actions is not None
    assert actions.kept_columns == ("description",)
    assert actions.source.column(keep_flag("description")).to_pylist() == [True, False]
    plan = merge_plan(actions, datafusion_quote)
    assert plan.updates['"description"'].startswith('CASE WHEN s."_cdc_keep__description"')
    assert plan.update_when == 'NOT s."_cdc_deleted" AND s."_cdc_version" >= t."_cdc_version"'
    assert plan.predicate == 't."id" = s."id"'
    assert '"id"' not in plan.updates  # keys never rewritten


def test_no_changes_no_actions() -> None:
    assert to_actions(ROUTE, []) is None


def test_unknown_schema_change_without_schema_still_builds() -> None:
    change = Change(
        TableId("shop", "products"), (("id", 5),), Op.DELETE, 3, None, Coordinates("t", 0, 0)
    )
    actions = to_actions(ROUTE, [change])
    assert actions is not None and actions.source.num_rows == 1
