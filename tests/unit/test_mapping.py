from pathlib import Path

import pytest

from cdc_sync.core.errors import ConfigError
from cdc_sync.core.model import TableId
from cdc_sync.mapping import (
    OnMalformed,
    OnSchemaChange,
    OnSnapshotEnd,
    OnTombstone,
    load_mapping,
)

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    return path


def test_demo_mapping_routes_every_demo_table_by_the_conventions() -> None:
    mapping = load_mapping(REPO / "mappings" / "shop.yaml")
    assert set(mapping.tables) == {
        TableId("shop", t) for t in ("customers", "products", "orders", "order_lines")
    }
    route = mapping.tables[TableId("shop", "customers")]
    assert (
        route.cache is not None and route.cache.key(route.table, "42") == "cache:shop.customers:42"
    )
    assert route.delta is not None and route.delta.relative_path() == "shop/customers"
    assert route.search is not None and route.search.index == "shop_customers"
    assert route.policies.on_tombstone is OnTombstone.DELETE
    assert route.policies.on_malformed is OnMalformed.DEAD_LETTER
    assert mapping.topics()[:2] == ["cdc.shop.cdc_sync_heartbeat", "cdc.shop.customers"]


def test_projection_and_rename_apply_to_rows() -> None:
    mapping = load_mapping(REPO / "mappings" / "shop.yaml")
    orders = mapping.tables[TableId("shop", "orders")]
    assert "internal_note" not in orders.project({"id": 1, "internal_note": "x", "status": "new"})
    lines = mapping.tables[TableId("shop", "order_lines")]
    assert lines.project({"unit_price": 3}) == {"price": 3}


def test_bad_input_policies_default_to_fail_and_tombstones_to_delete(tmp_path: Path) -> None:
    mapping = load_mapping(write(tmp_path, "source: {topic_prefix: p}\ntables:\n  a.b: {}\n"))
    policies = mapping.tables[TableId("a", "b")].policies
    # A tombstone is not bad input: on a compacted topic it is the delete.
    assert policies.on_tombstone is OnTombstone.DELETE
    assert policies.on_malformed is OnMalformed.FAIL
    assert policies.on_schema_change is OnSchemaChange.FAIL
    assert policies.on_snapshot_end is OnSnapshotEnd.SWEEP


@pytest.mark.parametrize(
    ("text", "path", "fragment"),
    [
        ("source: {topic_prefix: p}\nbogus: 1\n", "bogus", "known keys: dead_letter, defaults"),
        (
            "source: {topic_prefix: p}\ntables:\n  a.b: {colums: [x]}\n",
            "tables.a.b.colums",
            "known keys: cache, columns",
        ),
        (
            "source: {topic_prefix: p}\ntables:\n  a.b: {on_tombstone: drop}\n",
            "tables.a.b.on_tombstone",
            "'drop' is not one of delete, skip, fail",
        ),
        (
            "source: {topic_prefix: p}\ntables:\n  a.b: {delta: {history: true, drop: [x]}}\n",
            "tables.a.b.delta.history",
            "not supported with a Delta shape",
        ),
        (
            "source: {topic_prefix: p}\ntables:\n  a.b: {on_snapshot_end: drop}\n",
            "tables.a.b.on_snapshot_end",
            "'drop' is not one of sweep, keep",
        ),
        ("source: {topic_prefix: p}\ntables:\n  nodot: {}\n", "tables.nodot", "<schema>.<table>"),
        ("tables: {}\n", "source.topic_prefix", "non-empty string"),
        (
            "source: {topic_prefix: p}\ntables:\n  a.b: {}\nignore: [a.b]\n",
            "ignore",
            "both routed and ignored",
        ),
    ],
)
def test_errors_name_the_file_and_field_path(
    tmp_path: Path, text: str, path: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        load_mapping(write(tmp_path, text))
    assert raised.value.path == path
    assert fragment in str(raised.value)
    assert str(tmp_path / "m.yaml") in str(raised.value)


def test_every_captured_table_must_be_routed_or_ignored(tmp_path: Path) -> None:
    mapping = load_mapping(
        write(tmp_path, "source: {topic_prefix: p}\ntables:\n  a.b: {}\nignore: [a.c]\n")
    )
    assert mapping.uncovered([TableId("a", "b"), TableId("a", "c")]) == []
    assert mapping.uncovered([TableId("a", "d")]) == [TableId("a", "d")]


def test_delta_history_is_named_by_convention_and_tracks_the_listed_columns(
    tmp_path: Path,
) -> None:
    mapping = load_mapping(REPO / "mappings" / "shop.yaml")
    delta = mapping.tables[TableId("shop", "products")].delta
    assert delta is not None and delta.history and delta.track == ("price",)
    assert delta.history_relative_path() == "shop/products__history"
    assert mapping.history_tables() == frozenset({"shop.products"})
    custom = (
        "source: {topic_prefix: p}\ntables:\n  a.b: {delta: {history: true, history_table: h.x}}\n"
    )
    routed = load_mapping(write(tmp_path, custom)).tables[TableId("a", "b")].delta
    assert routed is not None and routed.history_relative_path() == "h/x" and routed.track is None


@pytest.mark.parametrize(
    ("delta", "message"),
    [
        ("{track: [price]}", "need history: true"),
        ("{history: true, track: [nope]}", "not among the table's columns"),
        ("{history: true, track: []}", "empty"),
    ],
)
def test_bad_history_settings_name_the_field(tmp_path: Path, delta: str, message: str) -> None:
    text = (
        f"source: {{topic_prefix: p}}\ntables:\n  a.b: {{columns: [id, price], delta: {delta}}}\n"
    )
    with pytest.raises(ConfigError, match=message):
        load_mapping(write(tmp_path, text))
