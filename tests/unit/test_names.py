"""Names a table gets outside Postgres (issue 27, point 9): spelled back losslessly, Debezium's
topic and include-list rules, valid index and Delta names, and tables that would share one
refused at mapping load, naming the fix."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_sync.core.errors import ConfigError
from cdc_sync.core.model import Coordinates, TableId, Tombstone
from cdc_sync.debezium.decoder import parse_record
from cdc_sync.mapping import load_mapping
from cdc_sync.names import (
    TOPIC_MAX,
    include_entry,
    include_patterns,
    included,
    index_for,
    index_problem,
    topic_name,
)

pytestmark = pytest.mark.unit
# Any Postgres identifier: any characters but NUL, at most 63 bytes (longer ones are cut).
identifiers = st.text(
    st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), min_size=1, max_size=20
)
tables = st.builds(TableId, identifiers, identifiers)


@given(tables)
def test_a_table_name_reads_back_as_it_was_written(table: TableId) -> None:
    # Mapping keys, checkpoint files and batch rows carry tables as text: a dot or a quote in a
    # name must not turn it into another table (`a.b` + `c` against `a` + `b.c`).
    assert TableId.parse(str(table)) == table


def test_only_names_that_need_it_are_quoted() -> None:
    assert str(TableId("shop", "Order Items")) == "shop.Order Items"
    assert str(TableId("a.b", "c")) == '"a.b".c'
    assert str(TableId("a", "b.c")) == 'a."b.c"'
    assert TableId.parse('app."x""y.z"') == TableId("app", 'x"y.z')
    for bad in ("a", "a.", ".b", "a.b.c", '"a', 'a."b"c'):
        with pytest.raises(ValueError, match=r"schema|quoted"):
            TableId.parse(bad)


@pytest.mark.parametrize(
    ("table", "topic"),
    [
        (TableId("shop", "orders"), "p.shop.orders"),
        (TableId("pt", "Odd name-x"), "p.pt.Odd_name-x"),  # observed, test_debezium_names.py
        (TableId("s", 'a"b'), "p.s.a_b"),
        (TableId("s", "a.b"), "p.s.a.b"),
        (TableId("s", "café"), "p.s.caf_"),
        (TableId("s", "t🙂"), "p.s.t__"),  # beyond the BMP: two UTF-16 units, two `_`
        (TableId("s", " "), "p.s"),  # a blank part is left out, as Debezium's mkString does
        (TableId("s", "x" * 300), "p.s." + "x" * 245),
    ],
)
def test_topic_names_follow_debeziums_rule(table: TableId, topic: str) -> None:
    assert topic_name("p", table) == topic


@given(tables)
def test_every_topic_name_is_one_kafka_accepts(table: TableId) -> None:
    topic = topic_name("prefix", table)
    assert re.fullmatch(r"[a-zA-Z0-9._-]{1,249}", topic) and len(topic) <= TOPIC_MAX
    if re.fullmatch(r"[a-zA-Z0-9_-]+", table.schema + table.table):
        assert topic == f"prefix.{table.schema}.{table.table}"


def test_include_lists_are_read_as_debezium_reads_them() -> None:
    patterns = include_patterns(r" shop\.orders , shop\.a\,b,shop\.é")
    assert [p.pattern for p in patterns] == [r"shop\.orders", r"shop\.a,b", r"shop\.é"]
    assert included(patterns, "SHOP.Orders")  # case-insensitive for ASCII letters
    assert included(patterns, "shop.a,b")
    assert not included(patterns, "shop.É")  # Java's CASE_INSENSITIVE stops at ASCII
    assert not included(patterns, "shop.orders_2026")  # the whole name


@given(tables, st.booleans())
def test_an_include_entry_captures_its_table(table: TableId, exact: bool) -> None:
    listed = ",".join([include_entry(table, exact), "other\\.x"])
    name = f"{table.schema}.{table.table}"
    assert included(include_patterns(listed), name)
    swapped = name.swapcase()
    if exact and swapped != name and swapped.swapcase() == name:
        assert not included(include_patterns(listed), swapped)


@given(st.lists(identifiers, min_size=1, max_size=3))
def test_a_derived_index_name_is_always_valid(parts: list[str]) -> None:
    assert index_problem(index_for(*parts)) is None


def test_invalid_index_names_are_named() -> None:
    assert index_problem("shop_orders") is None
    assert "lower case" in (index_problem("Shop") or "")
    assert "'*'" in (index_problem("a*b") or "")
    assert "start" in (index_problem("_x") or "")
    assert index_for("public", "Order Items") == "public_order_items"


def write(tmp_path: Path, tables: str) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(f"source: {{topic_prefix: p}}\ntables:\n{tables}")
    return path


def test_tables_differing_by_case_alone_are_refused_with_the_fix(tmp_path: Path) -> None:
    # Before: both loaded, and `Users` got the index `app_Users` no search server accepts.
    mapping = write(tmp_path, "  app.Users: {search: {}, delta: {}}\n  app.users: {search: {}}\n")
    with pytest.raises(ConfigError) as refused:
        load_mapping(mapping)
    message = str(refused.value)
    assert "app.Users (tables.app.Users.search.index: app_users)" in message
    assert "give each its own search.index" in message


def test_one_index_for_two_tables_is_refused(tmp_path: Path) -> None:
    mapping = write(
        tmp_path,
        "  app.order-items: {search: {index: items}}\n"
        "  app.order_items: {search: {index: items}}\n",
    )
    with pytest.raises(ConfigError, match="share one search index"):
        load_mapping(mapping)


def test_delta_tables_differing_by_case_alone_are_refused(tmp_path: Path) -> None:
    mapping = write(
        tmp_path,
        "  app.Users: {delta: {}}\n  app.users: {delta: {}}\n",
    )
    with pytest.raises(ConfigError, match=r"share one Delta table.*give each its own delta\.table"):
        load_mapping(mapping)
    fixed = write(
        tmp_path,
        "  app.Users: {delta: {table: app.users_upper}}\n  app.users: {delta: {}}\n",
    )
    assert len(load_mapping(fixed).tables) == 2


def test_topics_kafka_cannot_tell_apart_are_refused(tmp_path: Path) -> None:
    mapping = write(tmp_path, '  app."order.items": {cache: {}}\n  app.order_items: {cache: {}}\n')
    with pytest.raises(ConfigError, match=r"share one Kafka topic.*topic\.prefix"):
        load_mapping(mapping)


def test_a_delta_name_that_is_not_a_directory_name_is_refused(tmp_path: Path) -> None:
    mapping = write(tmp_path, "  app.a/b: {delta: {}}\n")
    with pytest.raises(ConfigError, match=r"tables\.app\.a/b\.delta\.table: .*directory"):
        load_mapping(mapping)


def test_the_job_reads_the_topics_debezium_writes(tmp_path: Path) -> None:
    # Before: the job subscribed to `p.app.Odd name-x`, a topic Debezium never writes.
    mapping = load_mapping(write(tmp_path, '  app.Odd name-x: {cache: {}}\n  app."a.b": {}\n'))
    assert mapping.topics() == ["p.app.Odd_name-x", "p.app.a.b"]
    assert mapping.topic_tables()["p.app.a.b"] == TableId("app", "a.b")


def test_a_tombstone_is_known_by_its_topics_table() -> None:
    # Before: read from the topic's last two parts: `Odd_name-x`, a table nobody routes.
    field = {"field": "id", "type": "int32", "optional": False}
    key = json.dumps({"schema": {"type": "struct", "fields": [field]}, "payload": {"id": 1}})
    topics = {"p.app.Odd_name-x": TableId("app", "Odd name-x")}
    parsed = parse_record(key.encode(), None, Coordinates("p.app.Odd_name-x", 0, 3), tables=topics)
    assert isinstance(parsed, Tombstone) and parsed.table == TableId("app", "Odd name-x")
