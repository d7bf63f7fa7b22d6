"""Per-sink shapes on real servers (search, Redis, Delta): soft deletes and filters stay fenced.

A soft delete is a write at the delete's version: a stale update after it is refused (the row
stays marked), a re-insert clears the mark. A row leaving a filter is a delete at its version:
a stale change that still matched cannot bring it back.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import redis

from cdc_sync.core.model import Change, Coordinates, Op, TableId
from cdc_sync.core.types import Column, ColumnType, RowSchema, TypeKind
from cdc_sync.mapping import TableRoute, load_mapping
from cdc_sync.sinks.base import Sink
from cdc_sync.sinks.delta import DeltaSink
from cdc_sync.sinks.redis import RedisSink
from cdc_sync.sinks.search import SearchSink
from cdc_sync.verify.compare import cache_rows, delta_rows, search_rows

pytestmark = pytest.mark.integration
TABLE = TableId("shop", "products")
SCHEMA = RowSchema(
    (
        Column("id", ColumnType(TypeKind.INT32, optional=False)),
        Column("name", ColumnType(TypeKind.STRING)),
        Column("price", ColumnType(TypeKind.DECIMAL, precision=10, scale=2)),
        Column("in_stock", ColumnType(TypeKind.BOOLEAN)),
    )
)
Rows = Callable[[], dict[str, dict[str, Any]]]


@pytest.fixture(params=["search", "cache", "delta"])
def target(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[TableRoute, Sink, Rows]]:
    tag = uuid.uuid4().hex[:8]
    mapping = tmp_path / "m.yaml"
    mapping.write_text(
        "version: 1\nsource: {topic_prefix: cdc}\ntables:\n  shop.products:\n"
        "    filter: in_stock\n    on_delete: soft\n"
        "    computed: {cents: 'CAST(price * 100 AS BIGINT)'}\n"
        f"    {request.param}: {{{_section(request.param, tag)}}}\n"
    )
    route = load_mapping(mapping).tables[TABLE]
    sink: Any
    if request.param == "search":
        sink = SearchSink("opensearch", request.getfixturevalue("search_url"), 3600)
        assert route.search is not None
        alias = route.search.index

        def rows() -> dict[str, dict[str, Any]]:
            sink.refresh(alias)
            return search_rows(sink.backend, route)
    elif request.param == "cache":
        url = request.getfixturevalue("redis_url")
        sink = RedisSink(url, tombstone_retention_seconds=3600)
        client = redis.Redis.from_url(url)

        def rows() -> dict[str, dict[str, Any]]:
            return cache_rows(client, route)
    else:
        sink = DeltaSink(tmp_path / "warehouse", 3600)

        def rows() -> dict[str, dict[str, Any]]:
            return delta_rows(tmp_path / "warehouse", route, ["id"])

    sink.ensure_target(route, route.sink_schema(request.param, SCHEMA))
    yield route, sink, rows
    sink.close()


def _section(sink: str, tag: str) -> str:
    return {
        "search": f"index: t_shaped_{tag}",
        "cache": f"prefix: t{tag}",
        "delta": f"table: shop.products_{tag}",
    }[sink]


def upsert(version: int, in_stock: bool = True, name: str = "n") -> Change:
    row = {"id": 1, "name": name, "price": Decimal("2.50"), "in_stock": in_stock}
    return Change(TABLE, (("id", 1),), Op.UPDATE, version, row, _at(version), 1_000, schema=SCHEMA)


def delete(version: int) -> Change:
    return Change(TABLE, (("id", 1),), Op.DELETE, version, None, _at(version), 1_700_000_000_000)


def _at(offset: int) -> Coordinates:
    return Coordinates("cdc.shop.products", 0, offset)


def write(target: tuple[TableRoute, Sink, Rows], *changes: Change) -> tuple[int, int]:
    route, sink, _ = target
    section = next(iter(route.shapes))
    result = sink.apply(route, route.sink_changes(SCHEMA, list(changes))[section])
    assert not result.failures
    return result.applied, result.fenced


def marked(route: TableRoute, row: dict[str, Any]) -> bool:
    shape = next(iter(route.shapes.values()))
    return row.get(shape.markers[0]) is True


def test_a_stale_update_after_a_soft_delete_stays_marked_and_a_reinsert_clears_it(
    target: tuple[TableRoute, Sink, Rows],
) -> None:
    route, _, rows = target
    assert write(target, upsert(10, name="first")) == (1, 0)
    assert rows()["1"]["cents"] == "250"
    write(target, delete(20))
    held = rows()["1"]
    assert marked(route, held) and held["name"] == "first"  # the stored fields stay
    write(target, upsert(15, name="stale"))  # older than the delete: fenced
    held = rows()["1"]
    assert marked(route, held) and held["name"] == "first"
    write(target, upsert(30, name="again"))
    held = rows()["1"]
    assert not marked(route, held) and held["name"] == "again"


def test_a_row_leaving_the_filter_is_deleted_and_a_stale_match_cannot_return(
    target: tuple[TableRoute, Sink, Rows],
) -> None:
    _, _, rows = target
    write(target, upsert(10))
    assert "1" in rows()
    write(target, upsert(20, in_stock=False))
    assert "1" not in rows()
    write(target, upsert(15, in_stock=True, name="stale"))
    assert "1" not in rows()
    write(target, upsert(30, in_stock=True, name="back"))
    assert rows()["1"]["name"] == "back"
