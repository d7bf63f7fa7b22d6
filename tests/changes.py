"""Routed `Change`s of the demo products table, built from real Debezium envelopes (tests only)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from cdc_sync.core.model import Change, TableId, Tombstone, tombstone_delete
from cdc_sync.debezium.decoder import parse_record
from cdc_sync.mapping import CacheRoute, MappingFile, Policies, SearchRoute, TableRoute
from tests.envelopes import PRODUCT_FIELDS, coords, envelope_bytes, field, key_bytes

LONG_FIELDS = [*PRODUCT_FIELDS[:-1], field("in_stock", "boolean"), field("stock", "int64")]


def products_route(index: str | None = None, prefix: str | None = None) -> TableRoute:
    """A products route with its own index and cache prefix, so tests never share state."""
    tag = uuid.uuid4().hex[:8]
    return TableRoute(
        table=TableId("shop", "products"),
        columns=None,
        rename={},
        search=SearchRoute(
            index or f"t_products_{tag}", {"properties": {"id": {"type": "integer"}}}
        ),
        cache=CacheRoute(prefix or f"t{tag}"),
        delta=None,
        policies=Policies(),
    )


def change(
    route: TableRoute,
    op: str,
    lsn: int,
    key: int,
    after: dict[str, Any] | None = None,
    fields: list[dict[str, Any]] | None = None,
) -> Change:
    parsed = parse_record(
        key_bytes("products", {"id": key}),
        envelope_bytes("products", op, lsn, after, fields=fields),
        coords(lsn),
    )
    assert isinstance(parsed, Change)
    return route.route(parsed)


def tombstone_only(route: TableRoute, key: int, offset: int = 0) -> Change:
    """The delete a compacted topic's tombstone stands for, without a delete event before it."""
    table = TableId("shop", "products")
    return route.route(tombstone_delete(Tombstone(table, (("id", key),), coords(offset))))


def mapping_of(*routes: TableRoute, **fields: Any) -> MappingFile:
    """A mapping file routing `routes` (prefix cdc, dead letters to dlq); `fields` override."""
    return MappingFile(
        path=Path("m.yaml"),
        topic_prefix="cdc",
        connector=None,
        dead_letter_topic="dlq",
        tombstone_retention_seconds=60,
        tables={route.table: route for route in routes},
        ignored=frozenset(),
        **fields,
    )
